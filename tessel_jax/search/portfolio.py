"""The list alternative of a searched schedule: greedy list schedules and
the classic baselines that fit the placement and the memory limit.

``Schedule.unroll(N)`` lowers the shortest of the composed repetend
(warmup + steady state + cooldown) and :func:`best_alternative`. The
classic orders are in the portfolio because hand-made fill orders (ZB-V's
greedy, DualPipeV's phases) can beat a generic warmup/cooldown completion
at small ``N`` and tight memory; with them the searched schedule is never
longer than a classic schedule that fits the same memory.

The alternatives cost far more than the repetend's unrolling (at 32
devices and ``N = 128``, seconds against tens of milliseconds), so they run
only when they can win and are shared:

* nothing runs when the makespan to beat is already at the lower bound
  ``simulate.lower_bound_makespan_shared`` (no schedule is shorter);
* the classic schedules run only when the list schedule misses that bound;
* the list schedule is cached per ``(graph, N, limit)``; every classic
  schedule's makespan and peak per ``(graph, N)`` whatever the limit (a
  schedule is rebuilt only when it wins).
"""

from __future__ import annotations

import functools
from typing import NamedTuple

from tessel_jax import simulate
from tessel_jax.graph import BlockGraph
from tessel_jax.schedule import Action, ScheduleError, UnrolledSchedule
from tessel_jax.search import baselines, list_schedule


class Classic(NamedTuple):
  """A classic schedule's figures (``baselines.run(name, graph, N)``)."""

  name: str
  makespan: int
  peak: int


@functools.lru_cache(maxsize=256)
def classic_figures(graph: BlockGraph,
                    num_microbatches: int) -> tuple[Classic, ...]:
  """Makespan and largest peak of every classic schedule that fits the
  placement (cached: they do not depend on the memory limit)."""
  out = []
  for name in baselines.for_placement(graph):
    try:
      sched = baselines.run(name, graph, num_microbatches)
    except (ValueError, ScheduleError):
      continue  # e.g. DualPipeV below 2D micro-batches
    out.append(Classic(name, sched.makespan, max(sched.peak_memory)))
  return tuple(out)


@functools.lru_cache(maxsize=8)
def _classic(name: str, graph: BlockGraph,
             num_microbatches: int) -> UnrolledSchedule:
  return baselines.run(name, graph, num_microbatches)


def best_baseline(graph: BlockGraph, num_microbatches: int,
                  memory_limit: int | None) -> UnrolledSchedule | None:
  """The shortest classic schedule of ``graph`` whose peak memory fits
  ``memory_limit`` on every device (None: no limit), or None."""
  best = None
  for c in classic_figures(graph, num_microbatches):
    if memory_limit is not None and c.peak > memory_limit:
      continue
    if best is None or c.makespan < best.makespan:
      best = c
  return None if best is None else _classic(best.name, graph,
                                            num_microbatches)


@functools.lru_cache(maxsize=16)
def cached_list_schedule(graph: BlockGraph, num_microbatches: int,
                         memory_limit: int | None
                         ) -> tuple[Action, ...] | None:
  """``list_schedule.best_list_schedule``, cached per arguments."""
  return list_schedule.best_list_schedule(graph, num_microbatches,
                                          memory_limit)


def makespan(graph: BlockGraph, actions: tuple[Action, ...]) -> int:
  span = {b.id: b.span for b in graph.blocks}
  return max((a.start + span[a.block] for a in actions), default=0)


def best_alternative(graph: BlockGraph, num_microbatches: int,
                     memory_limit: int | None, *, beat: int | None = None
                     ) -> tuple[Action, ...] | None:
  """Actions of the shortest of :func:`cached_list_schedule` and
  :func:`best_baseline` (None when neither fits the limit).

  Args:
    graph: The placement.
    num_microbatches: ``N``.
    memory_limit: Per-device limit (None: unlimited).
    beat: The makespan the caller already has (the repetend's unrolling),
      or None. At or below the lower bound nothing can be shorter: None is
      returned at once. Otherwise the result may be longer than ``beat``
      (the caller keeps the shorter).
  """
  n = num_microbatches
  bound = simulate.lower_bound_makespan_shared(graph, n)
  if beat is not None and beat <= bound:
    return None  # nothing is shorter than the bound
  listed = cached_list_schedule(graph, n, memory_limit)
  if listed is not None and makespan(graph, listed) <= bound:
    return listed  # no classic schedule is shorter
  base = best_baseline(graph, n, memory_limit)
  if base is None:
    return listed
  if listed is None or base.makespan < makespan(graph, listed):
    return tuple(sorted(base.actions))
  return listed
