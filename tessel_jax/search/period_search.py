"""The smallest period with a repetend under a memory limit (steps 1-3 of
``repetend``'s procedure): the first probe at the smallest period the
bounds allow, a start from above, then galloping, bisecting and descending.
"""

from __future__ import annotations

import dataclasses
import os
import warnings

from tessel_jax.graph import BlockGraph
from tessel_jax.search import clock
from tessel_jax.search.budget import Budget
from tessel_jax.search.errors import (InfeasibleScheduleError,
                                      SearchTimeoutError)
from tessel_jax.search.min_memory import min_memory_limit
from tessel_jax.search.modulo_construct import construct_repetend
from tessel_jax.search.modulo_model import solve_modulo
from tessel_jax.search.modulo_moves import one_at_a_time
from tessel_jax.search.modulo_solution import (ModuloSolution, pull_in,
                                               steady_peak)
from tessel_jax.search.period_bounds import period_upper_bound
from tessel_jax.search.prober import Prober


# Share of the budget of the first solve, at the smallest period. Where the
# limit binds, a relaxation usually proves that period infeasible first;
# where it admits it but the repetend is hard to find from one micro-batch
# at a time, a repetend found a little above is the far better start for
# the descent back down (nnshape, 8 devices, limit 30: P = 16 found with
# 1/16 and the descent, not with 1/4 from one micro-batch at a time).
_FIRST_SHARE = 1 / 16

# Restarts of the constructive scheduler under a limit (``first_probe``);
# 0 turns it off. On by default, before the first solve
# (``TESSEL_JAX_CONSTRUCT=first``); ``=after`` runs it once that solve
# decided nothing, ``=0`` turns it off. Its repetends are valid and proven
# at the bound, and cut the fast column's CPU (nnshape 4 devices, limit 13:
# 13.8 -> 2.3 CPU s for the period), but they are other repetends at the
# same period, whose ramps were longer (that case 2069 steps at N = 128,
# 2068 without it; BENCHMARKS, helper "fastcol", session 39) until the
# ramps' best cut got more time and the built repetend itself became a
# ramps candidate (``compose``; helper "fastcol2", session 40): never
# longer on the fast column and Tessel's held-out cases since, and, with
# one ramps pass for its candidates and a quick search's polish
# (``compose.built_composed``; helper "fastcol3", session 43), no more CPU
# than the solver alone summed over Tessel's held-out cases and far less
# on the fast column.
_MODE = os.environ.get("TESSEL_JAX_CONSTRUCT", "first")
if _MODE not in ("", "0", "first", "after"):
  warnings.warn(f"TESSEL_JAX_CONSTRUCT={_MODE!r} is not one of 'first',"
                " 'after' or '0': the constructive scheduler is off; unset it"
                " or set TESSEL_JAX_CONSTRUCT=first (before the first solve,"
                " the default) or =after (once it decided nothing) to turn"
                " it on",
                stacklevel=2)
CONSTRUCT_TRIES = 64 if _MODE in ("first", "after") else 0
CONSTRUCT_FIRST = _MODE == "first"


def search_period(solve: Prober, given: tuple | None,
                  time_limit_s: float) -> tuple[tuple, int]:
  """The smallest period with a repetend (steps 1-3 of the module doc).

  Args:
    solve: The search's solves (its ``low`` is the smallest period the
      bounds allow).
    given: ``(period, solution)`` of a ``start`` repetend, or None.
    time_limit_s: The search's budget (for the timeout message).

  Returns:
    ``(found, proven_low)``: ``found`` the best ``(period, solution)`` and
    every period below ``proven_low`` proven infeasible.

  Raises:
    InfeasibleScheduleError, SearchTimeoutError: see ``start_from_above``.
  """
  low = solve.low
  if given is not None and given[0] == low:
    # A known repetend at the smallest period: no solve.
    return given, low
  sequential = one_at_a_time(solve.graph)
  first = first_probe(solve, given, sequential)
  if first.found:
    return (low, first), low
  return after_first_probe(solve, given, sequential, first, time_limit_s)


def after_first_probe(solve: Prober, given: tuple | None, sequential: tuple,
                      first: ModuloSolution, time_limit_s: float
                      ) -> tuple[tuple, int]:
  """``search_period`` once its first probe (``first``) found nothing: a
  repetend from above (``given`` or ``start_from_above``), then galloping
  up, bisecting and descending (arguments and result as
  ``search_period``; ``sequential`` is ``one_at_a_time``'s repetend)."""
  graph, memory_limit, budget, low = (solve.graph, solve.memory_limit,
                                      solve.budget, solve.low)
  proven_low = low + 1 if first.status == "INFEASIBLE" else low
  found = solve.shorten(given or start_from_above(
      graph, memory_limit, sequential, solve, budget, solve.solve_kw,
      time_limit_s))
  if first.status == "INFEASIBLE":
    return descend(solve, budget, found, proven_low, solve.shorten,
                   solve.hint_at, graph.num_blocks, first.work)
  found, proven_low = gallop_up(solve, budget, found, low, proven_low,
                                solve.hint_at)
  found, proven_low = bisect_periods(solve, budget, found, proven_low,
                                     solve.tried, solve.hint_at)
  # The periods below were tried from one micro-batch at a time or a far
  # repetend; from the best one they often fall at once (nnshape, 8
  # devices, limit 30: P = 16 found in 0.14 s from the repetend at 18,
  # where 15 s from one micro-batch at a time found nothing).
  return descend(solve, budget, found, proven_low, solve.shorten,
                 solve.hint_at, graph.num_blocks, first.work)


def first_probe(solve: Prober, given: tuple | None,
                sequential: tuple) -> ModuloSolution:
  """The solve at the smallest period: the busiest device's load is the
  answer whenever memory allows.

  Under a limit the solve starts from ``given`` (a ``start`` repetend) or
  from ``sequential`` (one micro-batch at a time; xshape, 8 devices, limit
  6: P = 8 found in 0.5 s, where 4 s found nothing); where that decides
  nothing, from a repetend with no limit (nnshape, 8 devices, limit 30,
  P = 16: found in 0.23 s, where 8 s from one micro-batch at a time found
  nothing). Both are ``(period, solution)``. Where ``CONSTRUCT_TRIES``
  (on by default), before that second start the constructive scheduler
  (``construct_repetend``, pure Python; before the first solve with
  ``CONSTRUCT_FIRST``): a repetend it builds at the
  smallest period is optimal by the bound, so no more solves run
  (``solve.constructed`` says so; nnshape, 4 devices, limit 13, P = 16:
  0.3 CPU s where the solves took 12).
  """
  graph, low, budget = solve.graph, solve.low, solve.budget
  limited = solve.memory_limit is not None
  if limited and CONSTRUCT_FIRST and (built := _constructed(solve)):
    return built
  first = solve(low, share=_FIRST_SHARE,
                hint=solve.hint_at(given or sequential, low)
                if given or limited else None)
  if first.status == "UNKNOWN" and limited:
    if not CONSTRUCT_FIRST and (built := _constructed(solve)):
      return built
    unlimited = solve_modulo(graph, low, None, time_limit_s=budget.left(
        _FIRST_SHARE / 4), **solve.solve_kw)
    budget.spend(unlimited.work)
    if unlimited.found:
      first = solve(low, share=_FIRST_SHARE,
                    hint=pull_in(graph, low, None, unlimited))
  return first


def _constructed(solve: Prober) -> ModuloSolution | None:
  """The constructive scheduler's repetend at ``solve.low`` under the limit
  (``construct_repetend``; optimal by the bound, so ``solve.constructed``
  is set), or None (also where ``CONSTRUCT_TRIES`` is 0)."""
  if not CONSTRUCT_TRIES:
    return None
  cpu0 = clock.now()
  built = construct_repetend(solve.graph, solve.low, solve.memory_limit,
                             allow_wrap=solve.solve_kw["allow_wrap"],
                             seed=solve.solve_kw["seed"],
                             tries=CONSTRUCT_TRIES)
  solve.construct_s += clock.now() - cpu0
  solve.constructed = built is not None
  return built


def start_from_above(graph: BlockGraph, memory_limit: int | None,
                     sequential: tuple, solve, budget: Budget,
                     solve_kw: dict, time_limit_s: float) -> tuple:
  """A first repetend at a long period, to descend from.

  ``sequential`` (one micro-batch at a time, ``(period, solution)``) where
  its peak fits under the limit (no solver); else a solve at the largest
  useful period, where a limit that admits nothing is infeasible at every
  period.

  Returns:
    ``(period, solution)``.

  Raises:
    InfeasibleScheduleError: if no period admits a repetend under the limit.
    SearchTimeoutError: if CP-SAT found none in time.
  """
  period, one = sequential
  if memory_limit is None or steady_peak(
      graph, period, one.phases, one.offsets) <= memory_limit:
    return sequential
  high = period_upper_bound(graph)
  top = solve(high, share=1 / 4)
  if not top.found and top.status != "INFEASIBLE" and memory_limit:
    # Under a limit near the minimum, feasibility at the largest period is
    # hard to hit blind; minimising memory there is guided towards it
    # (xshape, 16 devices, limit 1: found in 2 s where the blind solve
    # found nothing in 8 s). Its solution fits if its peak does.
    low_memory = solve(high, share=1 / 4, objective="memory")
    if low_memory.found and low_memory.objective <= memory_limit:
      top = low_memory
    elif low_memory.status == "OPTIMAL":
      top = dataclasses.replace(low_memory, status="INFEASIBLE")
  if top.status == "INFEASIBLE":
    needed = min_memory_limit(graph, time_limit_s=budget.left(), **solve_kw)
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
  return high, top


def descend(solve, budget: Budget, found: tuple, proven_low: int,
            shorten, hint_at, num_blocks: int, scale_work: float
            ) -> tuple[tuple, int]:
  """Gallops down from the found period with quick probes, then proves the
  period just below the best one infeasible.

  For a limit that binds hard (the busiest device's load was proven
  infeasible): proving a period infeasible is then what costs, and only
  the proof just below the optimum is needed. So the probes further below
  the best period (steps 2, 4, ..., halved after a miss) only look for a
  repetend, with twice the work the finds so far took (``scale_work``, the
  first solve's, until the first find). The probe right below the best
  period is the decisive one and gets up to half the budget. Every
  repetend found is first shortened by ``shorten`` (idle steps dropped),
  and every probe starts from the best one (``hint_at``).
  Measured on tight limits: nnshape_eager, 4 devices, went from four
  proofs (3.9 s) to one (0.8-1.5 s); xshape, interleaved and mllm with 16
  devices became provable. The probes are first tried on relaxations
  (``relaxation``; the pooled one only here, ``descending=True``).

  Returns:
    ``(found, proven_low)`` updated.
  """
  step = 1
  find_work = max(found[1].work, scale_work)
  missed: set[int] = set()  # quick probes that found nothing
  while not budget.spent() and found[0] - 1 >= proven_low:
    quick = min(budget.total / 8, max(_PROBE_S_PER_BLOCK * num_blocks,
                                      2 * find_work))
    target = max(proven_low, found[0] - step)
    # A period a quick probe missed is probed again only as the decisive
    # one (nnshape, 32 devices, limit 4: the bound 199 was quick-probed six
    # times as the best repetend came down from 230 to 200).
    while target in missed and target < found[0] - 1:
      step = max(1, step // 2)
      target = max(proven_low, found[0] - step)
    decisive = target == found[0] - 1
    sol = solve(target, share=1 / 2 if decisive else quick / budget.total,
                quick_stage_s=quick / 4, hint=hint_at(found, target),
                descending=True)
    if sol.found:
      find_work = max(find_work, sol.work)
      found = shorten((target, sol))
      step *= 2
    elif sol.status == "INFEASIBLE":  # monotone: all P <= target fail too
      proven_low = target + 1
      step = max(1, step // 2)
    elif decisive:
      break  # the decisive period was not decided in time
    else:
      missed.add(target)
      step = max(1, step // 2)
  return found, proven_low


# Smallest work of a quick probe below the best period (``descend``), in
# deterministic seconds per block of the placement.
_PROBE_S_PER_BLOCK = 0.002


def gallop_up(solve, budget: Budget, found: tuple, low: int,
              proven_low: int, hint_at) -> tuple[tuple, int]:
  """Gallops up from the bound (steps 1, 2, 4, ...) to the first period
  with a repetend, each solve starting from the one found (``hint_at``).

  For a limit near the edge (CP-SAT could not decide the busiest device's
  load): the optimum is then usually just above the bound, and large
  periods of large placements are slow to solve (interleaved, 32 devices,
  limit 86: galloping down from 256 reached only 253 in 60 s). Each step
  gets at most an eighth of the budget.

  Returns:
    ``(found, proven_low)`` updated.
  """
  step, period = 1, low + 1
  while period < found[0] and not budget.spent():
    sol = solve(period, share=1 / 8, hint=hint_at(found, period))
    if sol.found:
      return (period, sol), proven_low
    if sol.status == "INFEASIBLE":  # monotone: all P <= period fail too
      proven_low = max(proven_low, period + 1)
    period = min(period + step, found[0])
    step *= 2
  return found, proven_low


def bisect_periods(solve, budget: Budget, found: tuple, proven_low: int,
                   tried: set[int], hint_at) -> tuple[tuple, int]:
  """Bisects the periods not yet tried between the proven bound and the
  best period found (each solve gets at most an eighth of the budget and
  starts from the best repetend, ``hint_at``).

  Returns:
    ``(found, proven_low)`` updated.
  """
  lo, hi = proven_low, found[0] - 1
  while lo <= hi and not budget.spent():
    untried = [p for p in range(lo, hi + 1) if p not in tried]
    if not untried:
      break
    mid = untried[len(untried) // 2]
    sol = solve(mid, share=1 / 8, hint=hint_at(found, mid))
    if sol.found:
      found = (mid, sol)
      hi = mid - 1
    else:
      if sol.status == "INFEASIBLE":
        proven_low = max(proven_low, mid + 1)
      lo = mid + 1
  return found, proven_low
