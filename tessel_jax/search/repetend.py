"""Repetend search: the smallest period under a memory limit, then latency.

Procedure (modulo model in ``modulo_model``; the steps are the modules
``period_search``, ``polish`` and ``compose``):

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
   from the repetend found (``period_search.descend``): each repetend
   found is shortened by dropping the steps idle on every device
   (``drop_idle_steps``); quick probes gallop down from it, and the
   period just below the best one gets the decisive solve. Every solve under a limit starts from the best
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
unless its composition meets the lower bound, steps 1-3 from scratch still
run after it, and the repetend they find at that period gets steps 4-5
too: the shorter of the two compositions is kept
(``compose.shorter_of_scratch``), so a start never makes the schedule
longer than that search from scratch (where it reaches the period in the
budget left).
"""


from __future__ import annotations

import dataclasses
import functools
import time

from tessel_jax import checks
from tessel_jax.graph import BlockGraph
from tessel_jax.schedule import Repetend, Schedule
from tessel_jax.search import clock, compose, portfolio
from tessel_jax.search.budget import Budget
from tessel_jax.search.period_bounds import (memory_period_bound,
                                             period_lower_bound,
                                             period_upper_bound)
from tessel_jax.search.period_search import search_period
from tessel_jax.search.polish import polish_budget
from tessel_jax.search.prober import Prober
from tessel_jax.search.relaxation import relaxations
from tessel_jax.search.search_args import check_search_args, given_start
from tessel_jax.search.window_bound import window_period_bound


def search_repetend(graph: BlockGraph, memory_limit: int | None = None, *,
                    allow_wrap: bool = True, time_limit_s: float = 30.0,
                    seed: int = 0, num_workers: int = 1,
                    complete: bool = True,
                    list_alternative: bool = True,
                    start: Repetend | None = None,
                    completion_time_s: float | None = None) -> Schedule:
  """Searches the most efficient repetend of ``graph`` under a memory limit.

  Args:
    graph: The placement.
    memory_limit: Per-device limit in the graph's memory units (None: none).
    allow_wrap: Let blocks wrap around the period end (Tessel forbids it).
    time_limit_s: CP-SAT budget for the whole search, in CP-SAT's
      deterministic seconds (so the same input and seed give the same
      schedule); as a safety net, CPU seconds of this thread are capped
      at twice that (``search.clock``; ``Schedule.cut_by_clock`` says
      whether a net cut the search).
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
      solve; the period search from scratch still runs there, and the
      shorter of the two compositions is kept (never longer than that
      search where it finds the period in the budget left).
    completion_time_s: Deterministic seconds of each CP-SAT completion
      ``Schedule.unroll(N)`` makes for an ``N`` below the templates (one
      per ``N``, and per split ``a + (N - a)`` for small ``N``); None:
      ``max(1, polish)`` (``compose.composed``). Must be positive.

  Returns:
    A Schedule whose ``status`` is ``OPTIMAL`` when no smaller period is
    feasible (proven) and whose ``latency_status`` says whether the latency
    at that period is proven minimal.

  Raises:
    InfeasibleScheduleError: if no schedule fits under ``memory_limit``.
    SearchTimeoutError: if no schedule was found in time.
  """
  memory_limit, time_limit_s = check_search_args(
      graph, memory_limit, allow_wrap, time_limit_s, seed, num_workers,
      complete, list_alternative)
  given = given_start(graph, start, memory_limit, allow_wrap)
  if completion_time_s is not None:
    completion_time_s = checks.time_limit(
        completion_time_s, "completion_time_s", where="search_repetend")
  t0, cpu0 = time.perf_counter(), clock.now()
  budget = Budget(time_limit_s, completion_s=completion_time_s)
  solve_kw = dict(allow_wrap=allow_wrap, seed=seed, num_workers=num_workers)
  high = period_upper_bound(graph)
  low = min(high, max(period_lower_bound(graph),
                      memory_period_bound(graph, memory_limit),
                      window_period_bound(graph, memory_limit)))
  solve = Prober(graph, memory_limit, budget, solve_kw, low,
                 relaxations(graph, memory_limit, allow_wrap=allow_wrap,
                             seed=seed))
  found, proven_low = search_period(solve, given, time_limit_s)
  period_seconds = time.perf_counter() - t0
  # Built with no solve, the search's CPU seconds so far (the bounds' small
  # models) say nothing of CP-SAT's rate: over ~0 work they made the
  # polish think the cap was near and skip the ramps.
  period_cpu = (0.0 if solve.constructed and not budget.used
                else clock.now() - cpu0 - solve.construct_s)
  # A built repetend gets what a search that found the period at once
  # gets, not a ``start``'s share of the budget (its descent already
  # shortened the latency; the share tripled the CPU of Tessel's xshape, 5
  # devices, limit 20, for no shorter schedule); its best cut's ramps are
  # still refined (``compose.built_composed``).
  polish = polish_budget(graph, budget, budget.used, period_cpu,
                         given=given is not None)
  schedule = compose.finished(solve, found, proven_low, polish, period_seconds,
                              complete)
  if found is given and complete and not budget.past_cap():
    schedule = compose.shorter_of_scratch(solve, schedule)
  if list_alternative:
    schedule = dataclasses.replace(
        schedule, alternative=functools.lru_cache(maxsize=16)(
            functools.partial(portfolio.best_alternative, graph,
                              memory_limit=memory_limit)))
  return dataclasses.replace(schedule,
                             search_seconds=time.perf_counter() - t0,
                             cut_by_clock=budget.cut_by_clock())
