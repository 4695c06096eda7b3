"""The latency polish of a repetend found at its period (step 4 of
``repetend``'s procedure): how much deterministic time it gets, and the
rounds of latency solves."""

from __future__ import annotations

import dataclasses

from tessel_jax.graph import BlockGraph
from tessel_jax.schedule import Repetend
from tessel_jax.search.budget import Budget
from tessel_jax.search.modulo_solution import ModuloSolution, pull_in
from tessel_jax.search.prober import Prober
from tessel_jax.simulate import critical_path


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


# Least deterministic seconds per block of the whole latency polish
# (``polish_budget``) where the budget allows it, however cheap the period
# search was; each round still starts at ``_LEAST_POLISH_PER_BLOCK`` and
# the rounds stop at the first that does not improve, so this costs only
# where the latency keeps falling. nnshape, 8 devices, limit 20, without
# wrap-around: its period (8) is found at once, so the polish was the
# least one round (0.02 s), which left latency 111 (13 periods) and an
# N = 128 makespan of 1055 against the bound 1052; three rounds (0.1 s)
# reach latency 94 (proven minimal without wrap-around), 11 periods, and
# 1052 (the held-out runner, ``experiments.search_cases_tessel``).
_LEAST_POLISH_TOTAL_PER_BLOCK = 0.005


# Least share of the budget for the latency polish of a search given a
# ``start`` repetend (see ``polish_budget``).
_START_POLISH_SHARE = 1 / 16


def polish_budget(graph: BlockGraph, budget: Budget, work: float,
                  seconds: float, *, given: bool) -> float:
  """Deterministic seconds for the latency polish (and, a quarter of it
  per cut, the ramps) once the period is found.

  The polish gets an eighth of the budget and no more than what finding
  the period took (at least ``_LEAST_POLISH_TOTAL_PER_BLOCK`` per block
  where that eighth allows, ``_LEAST_POLISH_PER_BLOCK`` in any case), so
  easy cases stay fast (all in deterministic time, so reproducible); the
  latency rounds stop early when one does not improve
  (``shortest_latency``). Measured on the 4-device placements with no
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
  ``_START_POLISH_SHARE`` of the budget. Near the budget's cap (CPU
  seconds: ``Budget.cap_left``) the polish gets what the cap leaves, at
  the CPU seconds per deterministic second the period search took; past
  it, the minimum (nnshape, 32 devices, limit 143: 21 s of polish after
  60 s of period search; nnshape, 16 devices, limit 56: 7 s after 55 s;
  both measured when the cap was wall seconds).

  Args:
    graph: The placement.
    budget: The search's budget.
    work: Deterministic seconds the period search took.
    seconds: CPU seconds it took (``clock.now``: the load does not move
      them, so neither does the polish).
    given: Whether it started from a ``start`` repetend.
  """
  least_polish = _LEAST_POLISH_PER_BLOCK * graph.num_blocks
  done = work + (budget.total * _START_POLISH_SHARE if given else 0.0)
  polish = min(budget.left(share=1 / 8), max(
      _LEAST_POLISH_TOTAL_PER_BLOCK * graph.num_blocks, done))
  cpu_per_work = seconds / max(work, 1e-3)
  by_cap = budget.cap_left() / max(cpu_per_work, 1.0)
  if by_cap < polish:  # near the cap: the CPU clock decides the polish
    budget.note_clock()
    polish = by_cap
  polish = max(least_polish, polish)
  if budget.past_cap():
    polish = least_polish
  return polish


def polished(solve: Prober, found: tuple, polish: float,
             seen: list[ModuloSolution] | None = None) -> ModuloSolution:
  """The repetend ``found`` (``(period, solution)``) with its offsets
  pulled in and its latency minimised with ``polish`` deterministic
  seconds (``shortest_latency``).

  The offsets are pulled in first (pure Python: the solver's first
  repetend often spreads one micro-batch over hundreds of periods), which
  gives CP-SAT a far better start on large placements (xshape, 16
  devices, 0.1 s: latency 133 instead of 725). ``seen``: as for
  ``shortest_latency``.
  """
  graph, limit = solve.graph, solve.memory_limit
  period, feasible = found
  return shortest_latency(
      lambda work, hint: solve(period, seconds=work, objective="latency",
                               hint=hint),
      lambda sol: pull_in(graph, period, limit, sol),
      graph, period, pull_in(graph, period, limit, feasible), polish,
      seen=seen)


def shortest_latency(solve, pull, graph: BlockGraph, period: int,
                     start: ModuloSolution, polish: float,
                     seen: list[ModuloSolution] | None = None
                     ) -> ModuloSolution:
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
    seen: If given, every round's repetend that became the best is
      appended to it, in order (the last is the one returned): a shorter
      latency does not always give shorter ramps, so ``compose`` compacts
      the ramps of each and keeps the shortest unrolling.

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
      if seen is not None:
        seen.append(pulled)
    if new_latency >= best_latency or sol.status == "OPTIMAL":
      break
    best_latency = new_latency
    work *= 2
  return best
