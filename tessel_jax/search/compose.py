"""The schedule of a repetend found (steps 4-5 of ``repetend``'s
procedure): its latency polished, its warmup and cooldown compacted, and,
from a ``start`` repetend, the shorter of it and the repetend the search
from scratch finds at that period."""

from __future__ import annotations

import dataclasses
import functools

from tessel_jax.graph import BlockGraph
from tessel_jax.schedule import Repetend, Schedule
from tessel_jax.search import clock, completion, ramps
from tessel_jax.search.budget import Budget
from tessel_jax.search.errors import SearchTimeoutError
from tessel_jax.search.modulo_moves import one_at_a_time
from tessel_jax.search.modulo_solution import (ModuloSolution, normalise,
                                               pull_in)
from tessel_jax.search.period_search import after_first_probe, first_probe
from tessel_jax.search.polish import polish_budget, polished
from tessel_jax.search.prober import Prober
from tessel_jax.simulate import lower_bound_makespan_shared


# Least number of cuts of the period whose ramps are compacted
# (``ramps.best_rotation``); the search's own cut is the first.
_LEAST_CUTS = 4
# The best cut's ramps are compacted once more with this many cuts' time
# (at most a quarter of the polish budget; ``ramps.refined``).
_REFINE_CUTS = 4


def finished(solve: Prober, found: tuple, proven_low: int, polish: float,
             period_seconds: float, complete: bool) -> Schedule:
  """The schedule of the repetend ``found`` (``(period, solution)``): its
  latency polished with ``polish`` deterministic seconds (``polished``)
  and, with ``complete`` (and time left), its ramps compacted
  (``composed``, or ``built_composed`` for a built repetend).

  A shorter latency does not always give shorter ramps: every repetend the
  latency rounds made the best (``polished``'s ``seen``) gets its ramps
  compacted, and the shortest unrolling at the reference ``N`` is kept
  (ties keep the shortest latency; none once one meets
  ``simulate.lower_bound_makespan_shared``). xshape, 4 devices, limit 5:
  round one gives 1029 steps at N = 128, round two a shorter latency and
  1030.
  """
  period = found[0]
  # A built repetend (``solve.constructed``) is itself a candidate: its
  # latency polish can lengthen the ramps (Tessel's nnshape, 7 devices,
  # limit 20: 1049 steps at N = 128 polished, 1048 = the bound unpolished).
  seen: list = ([pull_in(solve.graph, period, solve.memory_limit, found[1])]
                if solve.constructed else [])
  best = polished(solve, found, polish, seen=seen)
  rep = Repetend(period=period, offsets=normalise(best.offsets),
                 phases=best.phases)
  schedule = Schedule(
      graph=solve.graph, repetend=rep, memory_limit=solve.memory_limit,
      status="OPTIMAL" if proven_low >= period else "FEASIBLE",
      period_lower_bound=min(proven_low, period),
      latency_status=best.status, latency_lower_bound=best.bound or 0,
      period_seconds=period_seconds, source="tessel")
  if not complete or solve.budget.past_cap():
    return schedule
  if solve.constructed:
    return built_composed(
        _built_candidates(solve.graph, schedule, best, seen), polish,
        solve.budget, solve.solve_kw)
  shortest = composed(schedule, polish, solve.budget, solve.solve_kw)
  done = {(normalise(best.offsets), best.phases)}
  for earlier in reversed(seen[:-1]):
    if (normalise(earlier.offsets), earlier.phases) in done:
      continue  # the same repetend: the same ramps
    done.add((normalise(earlier.offsets), earlier.phases))
    n = ramps.reference_microbatches(shortest.repetend)
    if solve.budget.past_cap() or ramps.makespan(
        shortest, n) <= lower_bound_makespan_shared(solve.graph, n):
      break  # no time left, or nothing is shorter
    other = composed(dataclasses.replace(schedule, repetend=Repetend(
        period=period, offsets=normalise(earlier.offsets),
        phases=earlier.phases), latency_status="FEASIBLE"), polish,
                     solve.budget, solve.solve_kw)
    n = max(ramps.reference_microbatches(r.repetend)
            for r in (shortest, other))
    if ramps.makespan(other, n) < ramps.makespan(shortest, n):
      shortest = other
  return shortest


def shorter_of_scratch(solve: Prober, schedule: Schedule) -> Schedule:
  """``schedule`` (found from a ``start`` repetend at the smallest period)
  or the one the search from scratch finds at that period, whichever
  unrolls shorter (ties keep ``schedule``).

  From a given repetend the search makes no period probe, so it is fast and
  proven, but its latency polish and ramps start from a repetend found for
  another objective (the memory search's), and ended up to 0.7% longer at
  N = 128 than a search from scratch (zbv, 8 devices, limit 22: 1344
  against 1335; nnshape_eager, 8 devices, limit 20: 2366 against 2362).
  So the period search from scratch also runs (the same solves, hints and
  shares of the budget): its first probe, and where that finds nothing,
  the rest of it (``period_search.after_first_probe``: galloping up from
  one micro-batch at a time and descending). Where it reaches the start's
  period, its repetend gets the polish and ramps the search from scratch
  would give it, and the shorter of the two unrollings is kept: never
  longer than the search from scratch wherever that finds the period in
  the budget the start leaves. The repetends differ, and so do their
  ramps: nnshape, 4 devices, limit 14 (P = 16), from the start 2072 at
  N = 128, from the first probe nothing, from the rest of the search
  2066. Nothing runs where ``schedule`` already meets the lower bound
  (``simulate.lower_bound_makespan_shared``) at its reference ``N``
  (``ramps.reference_microbatches``): no schedule is shorter there.
  """
  n = ramps.reference_microbatches(schedule.repetend)
  if ramps.makespan(schedule, n) <= lower_bound_makespan_shared(
      solve.graph, n):
    return schedule
  budget, cpu0, used = solve.budget, clock.now(), solve.budget.used
  built_s = solve.construct_s
  found = _scratch_at_low(solve)
  if found is None or budget.past_cap():
    return schedule
  work = budget.used - used
  polish = polish_budget(
      solve.graph, budget, work,
      0.0 if solve.constructed and not work  # as ``search_repetend``
      else clock.now() - cpu0 - (solve.construct_s - built_s),
      given=solve.constructed)
  other = finished(solve, found, solve.low, polish,
                   schedule.period_seconds, complete=True)
  n = max(n, ramps.reference_microbatches(other.repetend))
  if ramps.makespan(other, n) < ramps.makespan(schedule, n):
    return other
  return schedule


def _scratch_at_low(solve: Prober) -> tuple | None:
  """The repetend the period search from scratch finds at ``solve.low``
  (``(period, solution)``), None if it ends above it or finds nothing in
  the budget left."""
  sequential = one_at_a_time(solve.graph)
  first = first_probe(solve, None, sequential)
  if first.found:
    return solve.low, first
  if solve.budget.spent():
    return None
  try:
    found, _ = after_first_probe(solve, None, sequential, first,
                                 solve.budget.total)
  except SearchTimeoutError:
    return None
  return found if found[0] == solve.low else None


def _built_candidates(graph: BlockGraph, schedule: Schedule,
                      best: ModuloSolution, seen: list[ModuloSolution]
                      ) -> list[Schedule]:
  """The schedules whose ramps ``finished`` compacts for a built repetend
  (``seen``: the built one pulled in, then each latency round's best;
  ``best``: the polished one, in ``schedule``), shortest latency first, one
  per latency: the least polished of it (the built one where the polish
  did not shorten the latency; it then replaces the polished one, whose
  latency status and bound hold for it). The others are ``FEASIBLE`` in
  latency."""
  spans = [b.span for b in graph.blocks]
  period = schedule.period

  def repetend(sol: ModuloSolution) -> Repetend:
    return Repetend(period, normalise(sol.offsets), sol.phases)

  by_latency: dict[int, Repetend] = {}
  for sol in [*seen, best]:  # least polished first
    rep = repetend(sol)
    by_latency.setdefault(rep.latency(spans), rep)
  ordered = sorted(by_latency.items())  # shortest latency (best's) first
  return [dataclasses.replace(
      schedule, repetend=rep,
      latency_status=schedule.latency_status if n == 0 else "FEASIBLE")
          for n, (_, rep) in enumerate(ordered)]


def built_composed(candidates: list[Schedule], polish: float, budget: Budget,
                   solve_kw: dict) -> Schedule:
  """The candidate whose ramps, compacted at the best of several cuts
  (``ramps.shortest_rotation``), unroll shortest (ties keep the earlier),
  its best cut's ramps then compacted once more (``ramps.refine_best``).

  ``composed`` on each candidate refined every candidate's best cut and
  solved each one's first cuts afresh: with a built repetend and its
  polished form, 5.0-12.3 CPU s of ramps on the fast column against
  1.7-6.4 s from CP-SAT's one repetend (helper "fastcol2", session 40).
  Here only the winner is refined, with ``_REFINE_CUTS`` cuts' time
  whatever the polish (a built repetend's polish is a quick search's, too
  little for the refine: nnshape, 4 devices, limit 13, needs 0.2 s on its
  best cut for 2067 steps at N = 128) and not where its ramps are the
  modulo schedule pulled in; a ramp size CP-SAT could not solve
  in a cut's time for one candidate is pulled in without a solve for the
  next (``ramps.Rotation.unsolved``; a later candidate whose cuts then
  have no ramps under the limit is skipped). No further candidate runs
  once one meets the lower bound or past the CPU cap.

  Raises:
    completion.CompletionError: if the first candidate's own cut has no
      ramps under the limit.
  """
  per_cut, max_cuts, _ = _ramp_times(candidates[0], polish)
  refine_s = _REFINE_CUTS * per_cut
  kw = dict(per_cut_s=per_cut, cap_deadline=budget.cap_deadline,
            seed=solve_kw["seed"], num_workers=solve_kw["num_workers"])
  best = unsolved = None
  for schedule in candidates:
    if best is not None and (budget.past_cap() or best[1].makespan <= (
        lower_bound_makespan_shared(schedule.graph, best[1].n_ref))):
      break
    try:
      rotation = ramps.shortest_rotation(schedule, max_cuts=max_cuts,
                                         unsolved=unsolved, **kw)
    except completion.CompletionError:
      if best is None:
        raise
      continue  # its own cut pulled in, over the limit: not a candidate
    unsolved = rotation.unsolved
    if best is None or rotation.overhead() < best[1].overhead():
      best = (schedule, rotation)
  schedule, rotation = best
  if rotation.templates.status != "MODULO":
    # Where CP-SAT found no ramps in a cut's time, four cuts' time did not
    # either (nnshape, 8 devices, limit 30: 3.4 CPU s for nothing).
    rotation = ramps.refine_best(schedule, rotation, refine_s=refine_s, **kw)
  return _with_ramps(schedule, rotation.repetend, rotation.templates,
                     polish, budget, solve_kw)


def _ramp_times(schedule: Schedule, polish: float) -> tuple[float, int,
                                                             float]:
  """Deterministic seconds per cut, most cuts and the refine's seconds of
  the ramps (see ``composed``)."""
  per_cut = max(0.05, min(polish / 4, 0.0025 * schedule.graph.num_blocks))
  return (per_cut, max(_LEAST_CUTS, int(polish / per_cut)),
          min(polish / 4, _REFINE_CUTS * per_cut))


def _with_ramps(schedule: Schedule, rep: Repetend,
                templates: completion.Templates, polish: float,
                budget: Budget, solve_kw: dict) -> Schedule:
  """``schedule`` with ``rep``, its ramps and a completer
  (``with_templates``; see ``composed`` for the completions' time)."""
  completion_s = (max(1.0, polish) if budget.completion_s is None
                  else budget.completion_s)
  return with_templates(dataclasses.replace(schedule, repetend=rep),
                        templates, solve_kw, completion_time_s=completion_s)


def composed(schedule: Schedule, polish: float, budget: Budget,
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
  ``_LEAST_CUTS``; the best cut's ramps are then compacted once more with
  ``_REFINE_CUTS`` cuts' time, at most a quarter of the polish
  (``ramps.refined``: nnshape, 4 devices, limit 13: 2068 -> 2067 at
  N = 128). (Past the search's cap the caller skips this and
  ``unroll`` compacts the modulo schedule in its own order: the warmup
  model of a repetend that spans many periods has thousands of actions and
  CP-SAT loads it for longer than its time limit; nnshape, 32 devices,
  limit 143, 67 periods: 24 s at 0.05 s.) Each completion of an ``N``
  below the templates gets ``max(1, polish)`` deterministic seconds, or
  ``budget.completion_s`` where the caller set it.
  """
  per_cut, max_cuts, refine_s = _ramp_times(schedule, polish)
  rep, templates = ramps.best_rotation(
      schedule, per_cut_s=per_cut, max_cuts=max_cuts,
      cap_deadline=budget.cap_deadline, seed=solve_kw["seed"],
      num_workers=solve_kw["num_workers"], refine_s=refine_s)
  return _with_ramps(schedule, rep, templates, polish, budget, solve_kw)


def with_templates(schedule: Schedule, templates: completion.Templates,
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
