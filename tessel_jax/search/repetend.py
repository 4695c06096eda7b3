"""Repetend search: the smallest period under a memory limit, then latency.

Procedure (modulo model in ``modulo_model``):

1. ``P_lb`` = the largest of the busiest device's load per micro-batch,
   the period the memory limit allows on average (``memory_period_bound``)
   and the one its memory windows allow (``window_bound``: activations of
   two micro-batches that cannot be held at once);
   ``P_max`` = the sum of all spans and delays (one micro-batch at a time
   fits in it). Solve at ``P_lb``; done if a repetend is found.
2. Start from above: the repetend that runs one micro-batch at a time
   (``one_at_a_time``, no solver) where its peak fits under the limit;
   else a solve at ``P_max``. If the limit is infeasible even at ``P_max``
   it is infeasible at every period (feasibility is monotone in ``P``):
   solve for the smallest memory and raise ``InfeasibleScheduleError``
   naming it.
3. Where ``P_lb`` was proven infeasible (the limit binds hard), descend
   from the repetend found (``_descend``): each repetend found is shortened
   by dropping the steps idle on every device (``drop_idle_steps``); quick
   probes gallop down from it, and the period just below the best one gets
   the decisive solve. Every solve under a limit starts from the best
   repetend's start times moved to its period (``moved_to_period``), and is
   first tried on the placement seen from the pipeline's end devices
   (``relaxation``): a period that small model cannot reach is proven
   infeasible without the full one. Where CP-SAT could not decide
   ``P_lb`` (a limit near the edge), gallop up from it, bisect between
   the last failure and the last success, then descend from the best
   repetend as above (the periods below it were tried from worse hints). A
   solve that times out counts as "not found" but leaves the bound
   unproven.
4. At that ``P`` minimise the latency of one micro-batch.
5. Compact the warmup and cooldown (``completion``) at several cuts of
   the period and keep the shortest (``ramps``).
6. Offer a list schedule of all ``N`` micro-batches (``list_schedule``) to
   ``Schedule.unroll``, which keeps it when it is strictly shorter.

A ``start`` repetend at the smallest period replaces steps 1-3 (no solve);
the first probe of step 1 still runs, and the repetend it finds gets steps
4-5 too: the shorter of the two compositions is kept
(``_shorter_of_scratch``), so a start never makes the schedule longer than
that search from scratch.
"""

from __future__ import annotations

import dataclasses
import functools
import time
from typing import Any

from ortools.sat.python import cp_model

from tessel_jax import checks, validate
from tessel_jax.graph import BlockGraph, check_searchable
from tessel_jax.schedule import (Repetend, Schedule, UnrolledSchedule,
                                 modulo_actions)
from tessel_jax.search import completion, portfolio, ramps
from tessel_jax.search.modulo_model import (ModuloSolution, drop_idle_steps,
                                            make_solver, moved_to_period,
                                            normalise, one_at_a_time,
                                            pull_in, solve_modulo,
                                            steady_peak)
from tessel_jax.search.relaxation import relaxations
from tessel_jax.search.window_bound import window_period_bound
from tessel_jax.simulate import critical_path, lower_bound_makespan_shared


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


def memory_period_bound(graph: BlockGraph, memory_limit: int | None, *,
                        time_limit_s: float = 5.0) -> int:
  """Smallest period the memory limit allows, from the average level.

  In the steady state a device's level averaged over one period is
  ``-sum_b m_b s_b / P`` (``s_b`` the start of block ``b`` in the frame of
  one micro-batch) and cannot exceed the limit, so
  ``P >= min_s(-sum_b m_b s_b) / limit`` where the minimum is over start
  times that respect the edges alone: a small LP-like CP-SAT model per
  device. Returns 1 when there is no limit or it proves nothing.
  """
  if not memory_limit or memory_limit <= 0:
    return 1
  horizon = period_upper_bound(graph) * (graph.num_blocks + 1)
  bound = 1
  for d in range(graph.num_devices):
    on_d = [b for b in graph.blocks_on(d) if b.memory != 0]
    if not on_d:
      continue
    # The constraints are differences of two starts (totally unimodular),
    # so at an integer horizon the optimum is the LP's, and the LP's
    # optimum is convex and non-increasing in the horizon: if one more
    # step does not lower it, no longer horizon does (interleaved, 32
    # devices: 0.06 s instead of 1.5 s a device).
    short = 2 * period_upper_bound(graph)
    area = _least_area(graph, on_d, short, time_limit_s)
    if area is None or area != _least_area(graph, on_d, short + 1,
                                           time_limit_s):
      area = _least_area(graph, on_d, horizon, time_limit_s)
    if area is not None:
      bound = max(bound, -(-area // memory_limit))
  return bound


def _least_area(graph: BlockGraph, on_device: list, horizon: int,
                time_limit_s: float) -> int | None:
  """``min -sum_b m_b s_b`` over ``on_device``'s blocks, starts in
  ``[0, horizon]`` that respect the edges (``memory_period_bound``); None
  if not proven in time."""
  model = cp_model.CpModel()
  start = {b.id: model.NewIntVar(0, horizon, f"s_{b.id}") for b in graph.blocks}
  for e in graph.edges:
    model.Add(start[e.dst] >= start[e.src] + graph.block(e.src).span + e.delay)
  model.Minimize(-sum(b.memory * start[b.id] for b in on_device))
  solver = make_solver(time_limit_s, 0, 1, interleave=False)
  if solver.Solve(model) != cp_model.OPTIMAL:
    return None
  return int(round(solver.ObjectiveValue()))


def period_upper_bound(graph: BlockGraph) -> int:
  """A period at which every memory-feasible placement has a schedule."""
  return max(period_lower_bound(graph),
             sum(b.span for b in graph.blocks) + sum(e.delay for e in graph.edges))


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


def search_repetend(graph: BlockGraph, memory_limit: int | None = None, *,
                    allow_wrap: bool = True, time_limit_s: float = 30.0,
                    seed: int = 0, num_workers: int = 1,
                    complete: bool = True,
                    list_alternative: bool = True,
                    start: Repetend | None = None) -> Schedule:
  """Searches the most efficient repetend of ``graph`` under a memory limit.

  Args:
    graph: The placement.
    memory_limit: Per-device limit in the graph's memory units (None: none).
    allow_wrap: Let blocks wrap around the period end (Tessel forbids it).
    time_limit_s: CP-SAT budget for the whole search, in CP-SAT's
      deterministic seconds (so the same input and seed give the same
      schedule); wall time is capped at twice that.
    seed: CP-SAT random seed.
    num_workers: CP-SAT subsolvers (interleaved deterministically).
    complete: Also compact warmup and cooldown (needed for ``unroll``'s
      template path).
    list_alternative: Let ``Schedule.unroll(N)`` return a memory-aware list
      schedule of all ``N`` micro-batches (``list_schedule``) when it is
      strictly shorter than the repetend's unrolling (typical with a loose
      limit, where the best schedule for a given ``N`` is GPipe-like and has
      no short repetend), or the shortest classic baseline whose peak fits
      the limit (``portfolio.best_alternative``).
    start: A known repetend of ``graph`` whose steady peak fits the limit
      (e.g. from ``smallest_memory_repetend``): the search starts from it
      instead of from one micro-batch at a time, and where its period is
      the smallest one the bounds allow, it is proven optimal without a
      solve; the first probe of the search from scratch still runs there,
      and the shorter of the two compositions is kept (never longer than
      that search where its first probe finds the period).

  Returns:
    A Schedule whose ``status`` is ``OPTIMAL`` when no smaller period is
    feasible (proven) and whose ``latency_status`` says whether the latency
    at that period is proven minimal.

  Raises:
    InfeasibleScheduleError: if no schedule fits under ``memory_limit``.
    SearchTimeoutError: if no schedule was found in time.
  """
  memory_limit, time_limit_s = _check_search_args(
      graph, memory_limit, allow_wrap, time_limit_s, seed, num_workers,
      complete, list_alternative)
  given = _given_start(graph, start, memory_limit, allow_wrap)
  t0 = time.perf_counter()
  budget = _Budget(time_limit_s)
  solve_kw = dict(allow_wrap=allow_wrap, seed=seed, num_workers=num_workers)
  high = period_upper_bound(graph)
  low = min(high, max(period_lower_bound(graph),
                      memory_period_bound(graph, memory_limit),
                      window_period_bound(graph, memory_limit)))
  solve = _Prober(graph, memory_limit, budget, solve_kw, low,
                  relaxations(graph, memory_limit, allow_wrap=allow_wrap,
                              seed=seed))
  found, proven_low = _search_period(solve, given, time_limit_s)
  period_seconds = time.perf_counter() - t0
  polish = _polish_budget(graph, budget, budget.used, period_seconds,
                          given=given is not None)
  schedule = _finished(solve, found, proven_low, polish, period_seconds,
                       complete)
  if found is given and complete and not budget.past_wall_cap():
    schedule = _shorter_of_scratch(solve, schedule)
  if list_alternative:
    schedule = dataclasses.replace(
        schedule, alternative=functools.lru_cache(maxsize=16)(
            functools.partial(portfolio.best_alternative, graph,
                              memory_limit=memory_limit)))
  return dataclasses.replace(schedule,
                             search_seconds=time.perf_counter() - t0)


@dataclasses.dataclass
class _Prober:
  """The solves of one search (``search_repetend``): a period's solve is
  first tried on the relaxations, every solve's work is charged to the
  budget, and the periods whose feasibility was asked are recorded.

  Attributes:
    graph, memory_limit: The search's placement and limit.
    budget: The search's budget.
    solve_kw: ``allow_wrap``, ``seed`` and ``num_workers`` for CP-SAT.
    low: The smallest period the bounds allow.
    relaxed: The placement's relaxations (``relaxation.relaxations``).
    tried: Periods whose feasibility was asked.
  """

  graph: BlockGraph
  memory_limit: int | None
  budget: "_Budget"
  solve_kw: dict
  low: int
  relaxed: list
  tried: set[int] = dataclasses.field(default_factory=set)

  def __call__(self, period: int, share: float = 1.0,
               descending: bool = False, seconds: float | None = None,
               **kw) -> ModuloSolution:
    """A solve at ``period`` with ``share`` of the budget (or ``seconds``);
    ``kw`` go to ``solve_modulo`` (``objective``, ``hint``, ...)."""
    budget = self.budget
    # Relaxations first (feasibility only). The pooled one has every block,
    # so it is only worth its time below a repetend found, where proofs are
    # what is missing, and above the smallest period, where a limit that
    # admits it only delays the find (nnshape, 4 devices, limit 13, P = 16:
    # 6.2 s to find the pooled model feasible).
    for relaxation in self.relaxed if "objective" not in kw else ():
      if relaxation.pooled and (not descending or period == self.low):
        continue
      proven, work = relaxation.proves_infeasible(
          period, budget.left(max(share, _RELAXATION_SHARE)),
          hint=kw.get("hint"), wall_limit_s=budget.wall_left())
      budget.spend(work)
      if proven:
        self.tried.add(period)
        return ModuloSolution("INFEASIBLE", work=work)
    sol = solve_modulo(self.graph, period, self.memory_limit,
                       time_limit_s=budget.left(share) if seconds is None
                       else seconds,
                       wall_limit_s=budget.wall_left(), **self.solve_kw, **kw)
    budget.spend(sol.work)
    if "objective" not in kw:
      self.tried.add(period)
    return sol

  def shorten(self, found: tuple) -> tuple:
    """``found`` with the steps idle on every device dropped."""
    return drop_idle_steps(self.graph, *found)

  def hint_at(self, found: tuple, period: int) -> ModuloSolution:
    """``found`` moved to ``period`` (a hint for a solve there)."""
    return moved_to_period(self.graph, *found, period)


def _search_period(solve: _Prober, given: tuple | None,
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
    InfeasibleScheduleError, SearchTimeoutError: see ``_start_from_above``.
  """
  graph, memory_limit, budget, low = (solve.graph, solve.memory_limit,
                                      solve.budget, solve.low)
  if given is not None and given[0] == low:
    # A known repetend at the smallest period: no solve.
    return given, low
  sequential = one_at_a_time(graph)
  first = _first_probe(solve, given, sequential)
  if first.found:
    return (low, first), low
  proven_low = low + 1 if first.status == "INFEASIBLE" else low
  found = solve.shorten(given or _start_from_above(
      graph, memory_limit, sequential, solve, budget, solve.solve_kw,
      time_limit_s))
  if first.status == "INFEASIBLE":
    return _descend(solve, budget, found, proven_low, solve.shorten,
                    solve.hint_at, graph.num_blocks, first.work)
  found, proven_low = _gallop_up(solve, budget, found, low, proven_low,
                                 solve.hint_at)
  found, proven_low = _bisect(solve, budget, found, proven_low, solve.tried,
                              solve.hint_at)
  # The periods below were tried from one micro-batch at a time or a far
  # repetend; from the best one they often fall at once (nnshape, 8
  # devices, limit 30: P = 16 found in 0.14 s from the repetend at 18,
  # where 15 s from one micro-batch at a time found nothing).
  return _descend(solve, budget, found, proven_low, solve.shorten,
                  solve.hint_at, graph.num_blocks, first.work)


def _first_probe(solve: _Prober, given: tuple | None,
                 sequential: tuple) -> ModuloSolution:
  """The solve at the smallest period: the busiest device's load is the
  answer whenever memory allows.

  Under a limit the solve starts from ``given`` (a ``start`` repetend) or
  from ``sequential`` (one micro-batch at a time; xshape, 8 devices, limit
  6: P = 8 found in 0.5 s, where 4 s found nothing); where that decides
  nothing, from a repetend with no limit (nnshape, 8 devices, limit 30,
  P = 16: found in 0.23 s, where 8 s from one micro-batch at a time found
  nothing). Both are ``(period, solution)``.
  """
  graph, low, budget = solve.graph, solve.low, solve.budget
  limited = solve.memory_limit is not None
  first = solve(low, share=_FIRST_SHARE,
                hint=solve.hint_at(given or sequential, low)
                if given or limited else None)
  if first.status == "UNKNOWN" and limited:
    unlimited = solve_modulo(graph, low, None, time_limit_s=budget.left(
        _FIRST_SHARE / 4), **solve.solve_kw)
    budget.spend(unlimited.work)
    if unlimited.found:
      first = solve(low, share=_FIRST_SHARE,
                    hint=pull_in(graph, low, None, unlimited))
  return first


def _polish_budget(graph: BlockGraph, budget: "_Budget", work: float,
                   seconds: float, *, given: bool) -> float:
  """Deterministic seconds for the latency polish (and, a quarter of it
  per cut, the ramps) once the period is found.

  The polish gets an eighth of the budget and no more than what finding
  the period took (at least ``_LEAST_POLISH_PER_BLOCK`` per block), so
  easy cases stay fast (all in deterministic time, so reproducible); the
  latency rounds stop early when one does not improve
  (``_shortest_latency``). Measured on the 4-device placements with no
  limit: 0.003 s instead of 0.02 s per block (and 0.05 s instead of 0.5 s
  of completion) cut nnshape's search from 1.95 s to 0.36 s,
  nnshape_eager's from 1.50 s to 0.42 s and zbv's from 1.71 s to 0.31 s,
  for repetend makespans at N = 128 longer by at most 0.7% (nnshape_eager
  2332 instead of 2316; its list schedule, which unroll keeps, meets the
  bound). Under the fast limits at 4 and 8 devices, once instead of four
  times the period's work kept every N = 128 makespan but one (mshape, 8
  devices: 1060 instead of 1053, both within 1% of the bound) and cut
  xshape's 8-device search from 6.3 s to 2.5 s.

  A repetend given as ``start`` cost the search nothing, but was found for
  another objective (the memory search's): its latency gets at least
  ``_START_POLISH_SHARE`` of the budget. Near the wall cap (a slow or
  loaded machine) the polish gets what the cap leaves, at the wall time
  per deterministic second the period search saw; past it, the minimum
  (nnshape, 32 devices, limit 143: 21 s of polish after 60 s of period
  search; nnshape, 16 devices, limit 56: 7 s after 55 s).

  Args:
    graph: The placement.
    budget: The search's budget.
    work: Deterministic seconds the period search took.
    seconds: Wall seconds it took.
    given: Whether it started from a ``start`` repetend.
  """
  least_polish = _LEAST_POLISH_PER_BLOCK * graph.num_blocks
  done = work + (budget.total * _START_POLISH_SHARE if given else 0.0)
  polish = min(budget.left(share=1 / 8), max(least_polish, done))
  wall_per_work = seconds / max(work, 1e-3)
  polish = max(least_polish,
               min(polish, budget.wall_left() / max(wall_per_work, 1.0)))
  if budget.past_wall_cap():
    polish = least_polish
  return polish


def _finished(solve: _Prober, found: tuple, proven_low: int, polish: float,
              period_seconds: float, complete: bool) -> Schedule:
  """The schedule of the repetend ``found`` (``(period, solution)``): its
  latency polished with ``polish`` deterministic seconds (``_polished``)
  and, with ``complete`` (and time left), its ramps compacted
  (``_composed``)."""
  period = found[0]
  best = _polished(solve, found, polish)
  rep = Repetend(period=period, offsets=normalise(best.offsets),
                 phases=best.phases)
  schedule = Schedule(
      graph=solve.graph, repetend=rep, memory_limit=solve.memory_limit,
      status="OPTIMAL" if proven_low >= period else "FEASIBLE",
      period_lower_bound=min(proven_low, period),
      latency_status=best.status, latency_lower_bound=best.bound or 0,
      period_seconds=period_seconds, source="tessel")
  if complete and not solve.budget.past_wall_cap():
    schedule = _composed(schedule, polish, solve.budget, solve.solve_kw)
  return schedule


def _shorter_of_scratch(solve: _Prober, schedule: Schedule) -> Schedule:
  """``schedule`` (found from a ``start`` repetend at the smallest period)
  or the one the search finds from scratch at its first probe, whichever
  unrolls shorter (ties keep ``schedule``).

  From a given repetend the search makes no period probe, so it is fast and
  proven, but its latency polish and ramps start from a repetend found for
  another objective (the memory search's), and ended up to 0.7% longer at
  N = 128 than a search from scratch (zbv, 8 devices, limit 22: 1344
  against 1335; nnshape_eager, 8 devices, limit 20: 2366 against 2362).
  So the first probe of the search from scratch (the same solve, hint and
  share of the budget) also runs; where it finds a repetend at that period,
  that repetend gets the polish and ramps the search from scratch would
  give it, and the shorter of the two unrollings is kept: never longer
  than the search from scratch wherever its first probe decides the
  period. (Where it does not, the search from scratch goes on to galloping
  and descending, which a given repetend at the smallest period makes
  moot.) Nothing runs where ``schedule`` already meets the lower bound
  (``simulate.lower_bound_makespan_shared``) at its reference ``N``
  (``ramps.reference_microbatches``): no schedule is shorter there.
  """
  n = ramps.reference_microbatches(schedule.repetend)
  if ramps.makespan(schedule, n) <= lower_bound_makespan_shared(
      solve.graph, n):
    return schedule
  budget, t0, used = solve.budget, time.perf_counter(), solve.budget.used
  first = _first_probe(solve, None, one_at_a_time(solve.graph))
  if not first.found or budget.past_wall_cap():
    return schedule
  polish = _polish_budget(solve.graph, budget, budget.used - used,
                          time.perf_counter() - t0, given=False)
  other = _finished(solve, (solve.low, first), solve.low, polish,
                    schedule.period_seconds, complete=True)
  n = max(n, ramps.reference_microbatches(other.repetend))
  if ramps.makespan(other, n) < ramps.makespan(schedule, n):
    return other
  return schedule


def _polished(solve: _Prober, found: tuple, polish: float) -> ModuloSolution:
  """The repetend ``found`` (``(period, solution)``) with its offsets
  pulled in and its latency minimised with ``polish`` deterministic
  seconds (``_shortest_latency``).

  The offsets are pulled in first (pure Python: the solver's first
  repetend often spreads one micro-batch over hundreds of periods), which
  gives CP-SAT a far better start on large placements (xshape, 16
  devices, 0.1 s: latency 133 instead of 725).
  """
  graph, limit = solve.graph, solve.memory_limit
  period, feasible = found
  return _shortest_latency(
      lambda work, hint: solve(period, seconds=work, objective="latency",
                               hint=hint),
      lambda sol: pull_in(graph, period, limit, sol),
      graph, period, pull_in(graph, period, limit, feasible), polish)


def _composed(schedule: Schedule, polish: float, budget: "_Budget",
              solve_kw: dict) -> Schedule:
  """``schedule`` with its warmup and cooldown compacted at the best of
  several cuts of the period (``ramps.best_rotation``).

  Warmup and cooldown start from the modulo schedule (a valid hint). A
  quarter of the polish budget per cut: with all of it, the N = 128
  makespans of zbv (16 devices, limit 44), interleaved (16, 25), nnshape
  (8, 30), mshape (8, 23), xshape (16, 1), zbv (8, 4) and kshape (16, 12)
  were the same and nnshape_eager's (8, 20) 2404 instead of 2362, for up
  to 6.6 s instead of 1.9 s of wall time. At most 0.0025 s per block: the
  makespans of those and of alphafold (16, 16), zbv (8, 22), interleaved
  (8, 13), mllm (16, 48), nnshape_eager (16, 45) and xshape (16, 14) were
  again the same (nnshape_eager, 8 devices: 0.34 s of compaction instead
  of 2.5 s). As many cuts as the polish budget pays for, at least
  ``_LEAST_CUTS``. (Past the search's wall cap the caller skips this and
  ``unroll`` compacts the modulo schedule in its own order: the warmup
  model of a repetend that spans many periods has thousands of actions and
  CP-SAT loads it for longer than its time limit; nnshape, 32 devices,
  limit 143, 67 periods: 24 s at 0.05 s.)
  """
  per_cut = max(0.05, min(polish / 4, 0.0025 * schedule.graph.num_blocks))
  rep, templates = ramps.best_rotation(
      schedule, per_cut_s=per_cut,
      max_cuts=max(_LEAST_CUTS, int(polish / per_cut)),
      wall_deadline=budget.wall_deadline, seed=solve_kw["seed"],
      num_workers=solve_kw["num_workers"])
  return _with_templates(dataclasses.replace(schedule, repetend=rep),
                         templates, solve_kw,
                         completion_time_s=max(1.0, polish))


def _check_search_args(graph: BlockGraph, memory_limit: Any,
                       allow_wrap: Any, time_limit_s: Any, seed: Any,
                       num_workers: Any, complete: Any, list_alternative: Any
                       ) -> tuple[int | None, float]:
  """Checks ``search_repetend``'s arguments before any solver call.

  Returns:
    ``(memory_limit, time_limit_s)`` as an int (or None) and a float.

  Raises:
    checks.InputError: naming the argument, its value and the fix.
  """
  where = "search_repetend"
  if not isinstance(graph, BlockGraph):
    raise checks.InputError(
        f"{where}: graph must be a tessel_jax BlockGraph (e.g."
        f" tj.placements.get('vshape', 4)), got {type(graph).__name__}")
  check_searchable(graph)
  limit = checks.memory_limit(memory_limit, where=where)
  seconds = checks.time_limit(time_limit_s, where=where)
  checks.integer(seed, "seed", low=0, high=2**31 - 1, where=where)
  checks.integer(num_workers, "num_workers", low=1, high=64, where=where)
  for name, value in (("allow_wrap", allow_wrap), ("complete", complete),
                      ("list_alternative", list_alternative)):
    checks.boolean(value, name, where=where)
  return limit, seconds


def _given_start(graph: BlockGraph, start: Any, memory_limit: int | None,
                 allow_wrap: bool) -> tuple[int, ModuloSolution] | None:
  """``start`` as ``(period, solution)`` after checking it.

  Raises:
    checks.InputError: if ``start`` is not a repetend of ``graph`` that
      fits ``memory_limit`` (and, with ``allow_wrap`` False, wraps no block).
  """
  if start is None:
    return None
  where = "search_repetend(start=...)"
  if not isinstance(start, Repetend):
    raise checks.InputError(f"{where}: expected a tessel_jax Repetend (e.g."
                            " from smallest_memory_repetend), got"
                            f" {type(start).__name__}")
  n, period = graph.num_blocks, start.period
  if (len(start.offsets) != n or len(start.phases) != n or period < 1
      or any(not 0 <= r < period for r in start.phases)
      or min(start.offsets) < 0):
    raise checks.InputError(f"{where}: not a repetend of {graph.name!r}"
                            f" ({n} blocks, phases in [0, period)); pass one"
                            " searched for this placement")
  spans = [b.span for b in graph.blocks]
  if not allow_wrap and any(r + w > period
                            for r, w in zip(start.phases, spans)):
    raise checks.InputError(f"{where}: a block wraps the period end; pass"
                            " allow_wrap=True or a repetend without wrap")
  num = 2 * start.max_offset + 2
  problems = validate.check(UnrolledSchedule(
      graph=graph, num_microbatches=num,
      actions=tuple(sorted(modulo_actions(Schedule(graph, start), num)))),
      memory_limit=None)
  if problems:
    raise checks.InputError(f"{where}: the repetend breaks the rules of"
                            f" {graph.name!r}: {problems[0].message}")
  peak = steady_peak(graph, period, start.phases, start.offsets)
  if memory_limit is not None and peak > memory_limit:
    raise checks.InputError(f"{where}: its steady peak {peak} exceeds the"
                            f" memory limit {memory_limit}; raise the limit"
                            " or pass a repetend that fits")
  return period, ModuloSolution("FEASIBLE", offsets=start.offsets,
                                phases=start.phases)


def _shortest_latency(solve, pull, graph: BlockGraph, period: int,
                      start: ModuloSolution, polish: float) -> ModuloSolution:
  """Minimises the latency of one micro-batch from ``start`` in rounds.

  Each round starts from the best repetend so far and gets twice the last
  one's work (the first an eighth of ``polish``, at least
  ``_LEAST_POLISH_PER_BLOCK`` per block); the rounds stop when one does
  not improve, proves its latency optimal or ``polish`` is spent; none
  runs when ``start`` already takes the critical path
  (``simulate.critical_path``). Under the fast limits
  the first round already tells whether more pays: nnshape, 4 devices,
  limit 13 and zbv, 16 devices, limit 44 kept the pulled-in latency (112)
  or improved it by 1.4% (211 to 208) after 3.75 s, 7 s of wall time.

  Args:
    solve: ``solve(work, hint)``, a latency solve at the period.
    pull: Pulls a solution's offsets in (``pull_in``).
    graph: The placement.
    period: The period.
    start: A repetend at ``period`` with its offsets pulled in.
    polish: Deterministic seconds for all rounds.

  Returns:
    The best repetend (pulled in), with the status and bound of the last
    latency solve that found one; ``start`` marked FEASIBLE if none did.
  """
  spans = [b.span for b in graph.blocks]

  def latency(sol: ModuloSolution) -> int:
    return Repetend(period, sol.offsets, sol.phases).latency(spans)

  best = dataclasses.replace(start, status="FEASIBLE", bound=None)
  best_latency = latency(best)
  shortest_possible = critical_path(graph)
  if best_latency <= shortest_possible:
    # One micro-batch already takes its critical path: nothing to polish
    # (under the tight limits at 8 devices this was 0.4-0.9 deterministic
    # s of a solve proving it for mllm, finetune and nnshape_eager).
    return dataclasses.replace(best, status="OPTIMAL",
                               bound=shortest_possible)
  spent, work = 0.0, max(_LEAST_POLISH_PER_BLOCK * graph.num_blocks,
                         polish / 8)
  while spent < polish:
    sol = solve(min(work, polish - spent), best)
    spent += sol.work
    if not sol.found:
      break
    pulled = pull(sol)
    new_latency = latency(pulled)
    if new_latency <= best_latency:  # ties keep the solve's status
      best = pulled
    if new_latency >= best_latency or sol.status == "OPTIMAL":
      break
    best_latency = new_latency
    work *= 2
  return best


# Least deterministic seconds per block of the latency polish
# (``search_repetend``), also the least a latency round gets. A latency
# solve runs 4-5 wall s per deterministic s here (the LP's cuts), so at
# 0.003 the two rounds of nnshape (4 devices, limit 4, P = 32) took 0.5 s
# of its 0.7 s search. At 0.001 (rounds given exactly that, not the
# budget's 0.05 s floor), with latency solves hinted in full
# (``modulo_model``), the 66 train cases at 4 and 8 devices under the
# tight, fast and no limits kept the same periods and N = 128 makespans
# but two (xshape, 8 devices, no limit: 1039 instead of 1040; zbv, 4
# devices, limit 12: 1299 instead of 1298), and nnshape's search took
# 0.18 s, zbv's (no limit) 0.12 s instead of 0.29 s. (Hinted with offsets
# and phases only, mllm, 4 devices, limit 12, lost 1.3%: 1568 instead of
# 1548, the bound.)
_LEAST_POLISH_PER_BLOCK = 0.001

# Least share of the budget for the latency polish of a search given a
# ``start`` repetend (see ``_polish_budget``).
_START_POLISH_SHARE = 1 / 16

# Least number of cuts of the period whose ramps are compacted
# (``ramps.best_rotation``); the search's own cut is the first.
_LEAST_CUTS = 4

# Least share of the budget a relaxed proof may take per period
# (``_Prober``; the decisive probe's share where larger): the
# subgraph's proofs take 0.01-2 deterministic s, the pooled model's up to 9.
_RELAXATION_SHARE = 1 / 8

# Share of the budget of the first solve, at the smallest period. Where the
# limit binds, a relaxation usually proves that period infeasible first;
# where it admits it but the repetend is hard to find from one micro-batch
# at a time, a repetend found a little above is the far better start for
# the descent back down (nnshape, 8 devices, limit 30: P = 16 found with
# 1/16 and the descent, not with 1/4 from one micro-batch at a time).
_FIRST_SHARE = 1 / 16


def _start_from_above(graph: BlockGraph, memory_limit: int | None,
                      sequential: tuple, solve, budget: "_Budget",
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


def _descend(solve, budget: "_Budget", found: tuple, proven_low: int,
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


# Smallest work of a quick probe below the best period (``_descend``), in
# deterministic seconds per block of the placement.
_PROBE_S_PER_BLOCK = 0.002


def _gallop_up(solve, budget: "_Budget", found: tuple, low: int,
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


def _bisect(solve, budget: "_Budget", found: tuple, proven_low: int,
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


class _Budget:
  """Solver time budget counted in CP-SAT's deterministic time.

  Deterministic time makes the same input and seed give the same schedule
  even when solves are cut by the limit (wall time would not).
  """

  def __init__(self, total: float):
    self.total = total
    self.used = 0.0
    # Safety net on a loaded machine (deterministic time can run slower
    # than the wall clock): never more than twice the budget in wall time.
    self.wall_deadline = time.perf_counter() + 2 * total

  def spend(self, work: float) -> None:
    self.used += work

  def left(self, share: float = 1.0) -> float:
    """Time for the next solve: ``share`` of the total, at most what is left."""
    return max(0.05, min(self.total * share, self.total - self.used))

  def wall_left(self) -> float:
    """Wall-clock seconds left before the cap (at least 0.05, so the
    polish after the period search still runs)."""
    return max(0.05, self.wall_deadline - time.perf_counter())

  def past_wall_cap(self) -> bool:
    return time.perf_counter() >= self.wall_deadline

  def spent(self) -> bool:
    return self.used >= self.total or self.past_wall_cap()


def _with_templates(schedule: Schedule, templates: completion.Templates,
                    solve_kw: dict, completion_time_s: float) -> Schedule:
  """Adds the templates and a completer for N too small for them."""
  graph, rep, limit = schedule.graph, schedule.repetend, schedule.memory_limit
  complete_kw = {k: v for k, v in solve_kw.items() if k != "allow_wrap"}

  completer = functools.lru_cache(maxsize=16)(functools.partial(
      completion.complete_all, graph, rep, memory_limit=limit,
      time_limit_s=completion_time_s, **complete_kw))
  return dataclasses.replace(
      schedule, warmup=templates.warmup, steady_start=templates.steady_start,
      cooldown=templates.cooldown, completer=completer)
