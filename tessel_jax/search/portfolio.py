"""The list alternative of a searched schedule: greedy list schedules and
the classic baselines that fit the placement and the memory limit.

``Schedule.unroll(N)`` lowers the shortest of the composed repetend
(warmup + steady state + cooldown) and :func:`best_alternative`. The
classic orders are in the portfolio because hand-made fill orders (ZB-V's
greedy, DualPipeV's phases) can beat a generic warmup/cooldown completion
at small ``N`` and tight memory; with them the searched schedule is never
longer than a classic schedule that fits the same memory.
"""

from __future__ import annotations

from tessel_jax.graph import BlockGraph
from tessel_jax.schedule import Action, ScheduleError, UnrolledSchedule
from tessel_jax.search import baselines, list_schedule


def best_baseline(graph: BlockGraph, num_microbatches: int,
                  memory_limit: int | None) -> UnrolledSchedule | None:
  """The shortest classic schedule of ``graph`` whose peak memory fits
  ``memory_limit`` on every device (None: no limit), or None."""
  best = None
  for name in baselines.for_placement(graph):
    try:
      sched = baselines.run(name, graph, num_microbatches)
    except (ValueError, ScheduleError):
      continue  # e.g. DualPipeV below 2D micro-batches
    if memory_limit is not None and max(sched.peak_memory) > memory_limit:
      continue
    if best is None or sched.makespan < best.makespan:
      best = sched
  return best


def makespan(graph: BlockGraph, actions: tuple[Action, ...]) -> int:
  span = {b.id: b.span for b in graph.blocks}
  return max((a.start + span[a.block] for a in actions), default=0)


def best_alternative(graph: BlockGraph, num_microbatches: int,
                     memory_limit: int | None) -> tuple[Action, ...] | None:
  """Actions of the shortest of :func:`list_schedule.best_list_schedule`
  and :func:`best_baseline` (None when neither fits the limit)."""
  listed = list_schedule.best_list_schedule(graph, num_microbatches,
                                            memory_limit)
  base = best_baseline(graph, num_microbatches, memory_limit)
  if base is None:
    return listed
  if listed is None or base.makespan < makespan(graph, listed):
    return tuple(sorted(base.actions))
  return listed
