"""The smallest per-device memory limit that admits a repetend (at a given
period, or at any)."""

from __future__ import annotations

from tessel_jax.graph import BlockGraph
from tessel_jax.schedule import Repetend
from tessel_jax.search.modulo_model import solve_modulo
from tessel_jax.search.modulo_moves import one_at_a_time
from tessel_jax.search.modulo_solution import normalise
from tessel_jax.search.period_bounds import period_upper_bound


def smallest_memory(graph: BlockGraph, period: int | None = None, *,
                    allow_wrap: bool = True, time_limit_s: float = 30.0,
                    seed: int = 0, num_workers: int = 1,
                    ) -> tuple[int | None, bool]:
  """Smallest per-device memory limit admitting a repetend of ``period``.

  Args:
    graph: The placement.
    period: The period; None: the largest useful period (then the answer
      is the smallest limit that admits any schedule).
    allow_wrap, time_limit_s, seed, num_workers: As for the search.

  Returns:
    ``(limit, proven)``: the smallest limit CP-SAT found a repetend for
    (None if none, e.g. ``period`` is too short at any memory) and whether
    CP-SAT proved it minimal within the time limit.
  """
  limit, proven, _ = smallest_memory_repetend(
      graph, period, allow_wrap=allow_wrap, time_limit_s=time_limit_s,
      seed=seed, num_workers=num_workers)
  return limit, proven


def smallest_memory_repetend(graph: BlockGraph, period: int | None = None, *,
                             allow_wrap: bool = True,
                             time_limit_s: float = 30.0, seed: int = 0,
                             num_workers: int = 1,
                             ) -> tuple[int | None, bool, Repetend | None]:
  """``smallest_memory`` and the repetend that needs that limit (None if
  none): a witness to pass as ``search_repetend(..., start=)``."""
  if period is None:
    period = period_upper_bound(graph)
  # One micro-batch at a time fits in any period at least as long as it
  # takes, and CP-SAT starts from it (nnshape_eager, 32 devices: without
  # it, 30 s found only a limit of 23 where this one needs 2).
  sequential_period, sequential = one_at_a_time(graph)
  sol = solve_modulo(graph, period, None, allow_wrap=allow_wrap,
                     objective="memory", time_limit_s=time_limit_s, seed=seed,
                     num_workers=num_workers,
                     hint=sequential if period >= sequential_period else None)
  if not sol.found:
    return None, False, None
  rep = Repetend(period, normalise(sol.offsets), sol.phases)
  return sol.objective, sol.status == "OPTIMAL", rep


def min_memory_limit(graph: BlockGraph, *, allow_wrap: bool = True,
                     time_limit_s: float = 30.0, seed: int = 0,
                     num_workers: int = 1) -> int | None:
  """Smallest per-device memory limit that admits any schedule.

  Returns None when CP-SAT cannot prove it within ``time_limit_s``
  (``smallest_memory`` also gives the best limit found).
  """
  limit, proven = smallest_memory(graph, None, allow_wrap=allow_wrap,
                                  time_limit_s=time_limit_s, seed=seed,
                                  num_workers=num_workers)
  return limit if proven else None


def min_memory_at_period(graph: BlockGraph, period: int, *,
                         allow_wrap: bool = True, time_limit_s: float = 30.0,
                         seed: int = 0, num_workers: int = 1) -> int | None:
  """Smallest per-device memory limit that admits period ``period``.

  With ``period`` the fastest period this is the memory the fastest
  schedule needs (TensorOpt's time/memory corner). Returns None when the
  period is infeasible at any memory or CP-SAT does not prove it in time.
  """
  limit, proven = smallest_memory(graph, period, allow_wrap=allow_wrap,
                                  time_limit_s=time_limit_s, seed=seed,
                                  num_workers=num_workers)
  return limit if proven else None
