"""Repetend search: the smallest period under a memory limit, then latency.

Procedure (modulo model in ``modulo_model``):

1. ``P_lb`` = the busiest device's load per micro-batch; ``P_max`` = the sum
   of all spans and delays (one micro-batch at a time fits in it).
2. If the limit is infeasible even at ``P_max`` it is infeasible at every
   period (feasibility is monotone in ``P``): solve for the smallest memory
   and raise ``InfeasibleScheduleError`` naming it.
3. Binary search the smallest feasible ``P`` in ``[P_lb, P_max]``; a solve
   that times out counts as "not found" but leaves the bound unproven.
4. At that ``P`` minimise the latency of one micro-batch.
5. Compact the warmup and cooldown (``completion``).
"""

from __future__ import annotations

import dataclasses
import time

from tessel_jax.graph import BlockGraph
from tessel_jax.schedule import Schedule, Repetend
from tessel_jax.search import completion
from tessel_jax.search.modulo_model import normalise, solve_modulo


class InfeasibleScheduleError(ValueError):
  """No schedule of the placement fits under the memory limit.

  Attributes:
    min_memory_limit: The smallest per-device limit for which a schedule
      exists (None if the solver could not determine it in time).
  """

  def __init__(self, message: str, min_memory_limit: int | None):
    super().__init__(message)
    self.min_memory_limit = min_memory_limit


class SearchTimeoutError(RuntimeError):
  """CP-SAT found no schedule within the time limit (none proven impossible)."""


def period_lower_bound(graph: BlockGraph) -> int:
  """Busiest device's total span per micro-batch."""
  return max(graph.device_load(d) for d in range(graph.num_devices))


def period_upper_bound(graph: BlockGraph) -> int:
  """A period at which every memory-feasible placement has a schedule."""
  return max(period_lower_bound(graph),
             sum(b.span for b in graph.blocks) + sum(e.delay for e in graph.edges))


def min_memory_limit(graph: BlockGraph, *, allow_wrap: bool = True,
                     time_limit_s: float = 30.0, seed: int = 0,
                     num_workers: int = 1) -> int | None:
  """Smallest per-device memory limit that admits any schedule.

  Returns None when CP-SAT cannot prove it within ``time_limit_s``.
  """
  sol = solve_modulo(graph, period_upper_bound(graph), None,
                     allow_wrap=allow_wrap, objective="memory",
                     time_limit_s=time_limit_s, seed=seed,
                     num_workers=num_workers)
  if sol.status != "OPTIMAL":
    return None
  return sol.objective


def search_repetend(graph: BlockGraph, memory_limit: int | None = None, *,
                    allow_wrap: bool = True, time_limit_s: float = 30.0,
                    seed: int = 0, num_workers: int = 1,
                    complete: bool = True) -> Schedule:
  """Searches the most efficient repetend of ``graph`` under a memory limit.

  Args:
    graph: The placement.
    memory_limit: Per-device limit in the graph's memory units (None: none).
    allow_wrap: Let blocks wrap around the period end (Tessel forbids it).
    time_limit_s: Total CP-SAT time budget for the whole search.
    seed: CP-SAT random seed (with ``num_workers=1`` the result is
      reproducible).
    num_workers: CP-SAT worker threads.
    complete: Also compact warmup and cooldown (needed for ``unroll``'s
      template path).

  Returns:
    A Schedule whose ``status`` is ``OPTIMAL`` when the period is proven
    minimal and the latency at that period proven minimal.

  Raises:
    InfeasibleScheduleError: if no schedule fits under ``memory_limit``.
    SearchTimeoutError: if no schedule was found in time.
  """
  t0 = time.perf_counter()
  deadline = t0 + time_limit_s

  def left() -> float:
    return max(0.05, deadline - time.perf_counter())

  solve_kw = dict(allow_wrap=allow_wrap, seed=seed, num_workers=num_workers)
  low, high = period_lower_bound(graph), period_upper_bound(graph)
  proven_low = low  # every period below this is proven infeasible
  found = None  # (period, solution)

  first = solve_modulo(graph, low, memory_limit, time_limit_s=left(), **solve_kw)
  if first.found:
    found = (low, first)
  else:
    if first.status == "INFEASIBLE":
      proven_low = low + 1
    top = solve_modulo(graph, high, memory_limit, time_limit_s=left(),
                       **solve_kw)
    if top.status == "INFEASIBLE":
      needed = min_memory_limit(graph, time_limit_s=left(), **solve_kw)
      hint = (f"the smallest limit that works is {needed}" if needed is not None
              else "the smallest workable limit was not found in time")
      raise InfeasibleScheduleError(
          f"no schedule of placement {graph.name!r} fits under memory limit"
          f" {memory_limit} per device at any period; {hint}. Raise"
          " memory_limit (or recompute activations to shrink block memory).",
          needed)
    if not top.found:
      raise SearchTimeoutError(
          f"CP-SAT found no schedule of placement {graph.name!r} in"
          f" {time_limit_s:.1f} s; raise the time limit")
    found = (high, top)
    lo, hi = low + 1, high - 1  # search [lo, hi] for something smaller
    while lo <= hi and time.perf_counter() < deadline:
      mid = (lo + hi) // 2
      sol = solve_modulo(graph, mid, memory_limit, time_limit_s=left(),
                         **solve_kw)
      if sol.found:
        found = (mid, sol)
        hi = mid - 1
      else:
        if sol.status == "INFEASIBLE":  # monotone: all P <= mid fail too
          proven_low = max(proven_low, mid + 1)
        lo = mid + 1

  period, _ = found
  best = solve_modulo(graph, period, memory_limit, objective="latency",
                      time_limit_s=left(), **solve_kw)
  if not best.found:
    best = found[1]
  rep = Repetend(period=period, offsets=normalise(best.offsets),
                 phases=best.phases)
  period_proven = proven_low >= period
  status = ("OPTIMAL" if period_proven and best.status == "OPTIMAL"
            else "FEASIBLE")
  schedule = Schedule(graph=graph, repetend=rep, memory_limit=memory_limit,
                      status=status, period_lower_bound=min(proven_low, period),
                      source="tessel")
  if complete:
    templates = completion.compact_templates(
        graph, rep, memory_limit, time_limit_s=max(1.0, left()), seed=seed,
        num_workers=num_workers)
    schedule = _with_templates(schedule, templates, solve_kw)
  return dataclasses.replace(schedule,
                             search_seconds=time.perf_counter() - t0)


def _with_templates(schedule: Schedule, templates: completion.Templates,
                    solve_kw: dict) -> Schedule:
  graph, rep, limit = schedule.graph, schedule.repetend, schedule.memory_limit

  complete_kw = {k: v for k, v in solve_kw.items() if k != "allow_wrap"}

  def completer(n: int):
    return completion.complete_all(graph, rep, n, limit, **complete_kw)

  return dataclasses.replace(
      schedule, warmup=templates.warmup, steady_start=templates.steady_start,
      cooldown=templates.cooldown, completer=completer)
