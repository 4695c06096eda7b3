"""CP-SAT model of one repetend (modulo schedule) at a fixed period.

For a fixed period ``P`` every block ``b`` gets a phase ``r_b`` in ``[0, P)``
and a micro-batch offset ``k_b >= 0``; micro-batch ``j`` runs ``b`` at
``(k_b + j) * P + r_b`` (DESIGN.md §3). With ``P`` fixed all constraints are
linear:

* edges: ``s_dst >= s_src + span_src + delay`` with ``s_b = k_b * P + r_b``;
* devices: the occupied steps of all blocks of a device, taken modulo ``P``,
  are disjoint; with wrap-around allowed each block is an interval at ``r_b``
  and a copy at ``r_b + P`` (exact since every span is <= P), otherwise
  ``r_b + span_b <= P``;
* memory: in the steady state the level of device ``d`` at phase ``t`` is
  ``sum_b m_b [r_b <= t] - sum_b m_b k_b`` (sums over the blocks of ``d``,
  whose memory adds up to zero). Its maximum is reached at the phase of a
  block with positive memory, so one linear constraint per such block, with a
  boolean per pair of blocks of the device for "starts earlier in the period".

Feasibility is monotone in ``P`` (a schedule at ``P`` stays valid at any
larger period with the same ``k`` and ``r``), which the period search uses.

How each question is solved (measured on this project's placements; every
stage is limited in deterministic time, so the outcome depends only on the
input and the seed):

* feasibility with no memory limit: CP-SAT's interleaved portfolio, which
  finds repetends in milliseconds;
* feasibility under a limit, in stages until one decides: the interleaved
  portfolio for 0.2 s; memory minimisation with no LP
  (``linearization_level=0``) for 0.2 s, stopped as soon as a repetend
  within the limit is found (nnshape, 16 devices, limit 4, at the largest
  period: found in 0.3 s, where the portfolio found nothing in 15 s and the
  LP-guided search below nothing in 12 s); then, for the rest of the
  budget, memory minimisation with the full LP relaxation
  (``linearization_level=2``), stopped at a repetend within the limit
  (feasible) or a proven bound above it (infeasible). The last stage
  decides what the others cannot when the limit binds: nnshape, 4 devices,
  limit 4, P = 31 proven infeasible in 1.1 s; zbv, 8 devices, limit 4:
  P = 49 proven infeasible in 0.4 s and P = 50 found in 0.6 s, where the
  portfolio gave UNKNOWN after 10 s each;
* ``"memory"``: the same LP-guided single worker (5-50x faster than the
  portfolio at proving the smallest limit);
* ``"latency"``: the plain single worker from the hint (interleaved was
  150x slower on 8-device vshape).

The rules are in ``modulo_constraints``, the solvers in ``cpsat``.
"""

from __future__ import annotations

import dataclasses

from ortools.sat.python import cp_model

from tessel_jax.graph import BlockGraph
from tessel_jax.search import clock
from tessel_jax.search.cpsat import StopWithin, make_solver
from tessel_jax.search.modulo_constraints import (add_complete_hint,
                                                  add_latency, add_memory,
                                                  add_schedule,
                                                  latency_horizon,
                                                  read_solution)
from tessel_jax.search.modulo_solution import ModuloSolution


# Deterministic seconds given to each quick stage of a feasibility solve
# under a limit before the LP-guided memory minimisation takes over
# (``solve_modulo``): enough for the repetends they find at once, little
# wasted where the limit binds.
_QUICK_STAGE_S = 0.2


# The stages of a feasibility solve under a limit (``solve_modulo``), as
# (objective, linearization level): the interleaved portfolio on the limit;
# memory minimisation with no LP; memory minimisation with the full LP
# relaxation, which gets the rest of the time.
_STAGES = (("none", None), ("memory", 0), ("memory", 2))


def solve_modulo(graph: BlockGraph, period: int, memory_limit: int | None, *,
                 allow_wrap: bool = True, objective: str = "none",
                 time_limit_s: float = 10.0, seed: int = 0,
                 num_workers: int = 1,
                 hint: "ModuloSolution | None" = None,
                 quick_stage_s: float = _QUICK_STAGE_S,
                 horizon: int | None = None,
                 pooled_devices: tuple[int, ...] = (),
                 cap_s: float | None = None,
                 proof_only: bool = False) -> ModuloSolution:
  """Builds and solves the modulo model at ``period`` (the strategy per
  question is in the module doc).

  Args:
    graph: The placement.
    period: Fixed period ``P`` (>= the busiest device's load).
    memory_limit: Per-device memory limit; None for no limit. Ignored when
      ``objective == "memory"``.
    allow_wrap: Let a block run across the end of the period.
    objective: ``"none"`` (feasibility), ``"latency"`` (one micro-batch from
      first start to last end) or ``"memory"`` (the largest steady-state
      level over all devices).
    time_limit_s: CP-SAT time limit.
    seed: CP-SAT random seed.
    num_workers: CP-SAT subsolvers, interleaved deterministically.
    hint: A solution at this period to start from (e.g. the feasibility
      solve's when minimising latency), or a near one (``moved_to_period``).
    quick_stage_s: Deterministic seconds of each of the two quick stages
      of a feasibility solve under a limit (the period search shortens
      them to what finding a repetend has cost it so far).
    horizon: Largest start of a block in the frame of one micro-batch
      (default ``latency_horizon(graph, period)``); a relaxation passes its
      full placement's, so it admits every repetend the full model does.
    pooled_devices: Devices whose rules are relaxed (``relaxation``): their
      memory is not limited, and instead of one block at a time each they
      share one pool of as many slots as there are such devices (a block
      takes one slot per pooled device it occupies, so a block on all
      devices still runs alone).
    cap_s: CPU seconds of this thread for all stages together (a safety
      net where deterministic time runs slow; the period search passes
      what its own cap leaves: ``Budget.cap_left``). None:
      ``cpsat._CPU_PER_DETERMINISTIC_S`` times each stage's budget.
    proof_only: Under a limit, run only the last (LP-guided) stage, the one
      that proves periods infeasible: for a relaxation, whose repetends are
      of no use (nnshape, 4 devices, limit 4, pooled, P = 31: proven in
      0.21 deterministic s, 0.6 s wall, where the quick stages first spent
      0.4 s, 1.3 s wall, finding nothing).

  Returns:
    A ModuloSolution.
  """
  kw = dict(allow_wrap=allow_wrap, seed=seed, num_workers=num_workers,
            hint=hint, horizon=horizon, pooled_devices=pooled_devices)
  if objective != "none" or memory_limit is None:
    return _solve_once(graph, period, memory_limit, objective=objective,
                       time_limit_s=time_limit_s, cap_s=cap_s,
                       **kw)
  stages = _STAGES[-1:] if proof_only else _STAGES
  return _solve_in_stages(graph, period, memory_limit, stages, kw,
                          time_limit_s=time_limit_s,
                          quick_stage_s=quick_stage_s,
                          cap_s=cap_s)


def _solve_in_stages(graph: BlockGraph, period: int, memory_limit: int,
                     stages: tuple, kw: dict, *, time_limit_s: float,
                     quick_stage_s: float, cap_s: float | None
                     ) -> ModuloSolution:
  """Feasibility under ``memory_limit``: ``stages`` (``_STAGES`` or its
  last) in turn until one decides; every stage but the last gets
  ``quick_stage_s`` (at most a quarter of the budget), the last the rest.
  A stage the CPU cap cut ends the solve (arguments as
  ``solve_modulo``; ``kw`` its solver arguments)."""
  deadline = None if cap_s is None else clock.now() + cap_s
  used = seconds = 0.0
  sol = ModuloSolution("UNKNOWN")
  for i, (stage_objective, level) in enumerate(stages):
    if deadline is not None:
      kw["cap_s"] = deadline - clock.now()
    last = i == len(stages) - 1
    limit = (max(0.01, time_limit_s - used) if last
             else min(quick_stage_s, time_limit_s / 4))
    if stage_objective == "none":
      sol = _solve_once(graph, period, memory_limit, objective="none",
                        time_limit_s=limit, **kw)
    else:
      sol = _decide_by_memory(_solve_once(
          graph, period, None, objective="memory", stop_at=memory_limit,
          linearization_level=level, time_limit_s=limit, **kw), memory_limit)
    used, seconds = used + sol.work, seconds + sol.seconds
    stopped_by_cap = sol.work < 0.99 * limit
    if sol.status != "UNKNOWN" or stopped_by_cap:
      break
  return dataclasses.replace(sol, seconds=seconds, work=used)


def _decide_by_memory(sol: ModuloSolution, memory_limit: int
                      ) -> ModuloSolution:
  """Feasibility under ``memory_limit`` from a memory minimisation."""
  if sol.found and sol.objective <= memory_limit:
    status = "OPTIMAL"  # feasibility decided: a repetend fits
  elif sol.status == "INFEASIBLE" or (sol.bound is not None and
                                      sol.bound > memory_limit):
    status = "INFEASIBLE"  # at this period at any memory, or above the limit
  else:
    status = "UNKNOWN"
  return ModuloSolution(
      status, offsets=sol.offsets if status == "OPTIMAL" else (),
      phases=sol.phases if status == "OPTIMAL" else (),
      seconds=sol.seconds, work=sol.work)


def _solve_once(graph: BlockGraph, period: int, memory_limit: int | None, *,
                allow_wrap: bool, objective: str, time_limit_s: float,
                seed: int, num_workers: int,
                hint: "ModuloSolution | None",
                stop_at: int | None = None,
                linearization_level: int | None = None,
                horizon: int | None = None,
                pooled_devices: tuple[int, ...] = (),
                cap_s: float | None = None) -> ModuloSolution:
  """One CP-SAT solve of the modulo model (arguments as ``solve_modulo``).

  Args:
    stop_at: With ``objective="memory"``, stop as soon as a repetend with
      peak ``<= stop_at`` is found or the proven bound exceeds ``stop_at``
      (both at deterministic points of the single-worker search).
    linearization_level: CP-SAT's LP relaxation level; None: 2 when
      minimising memory, CP-SAT's default otherwise.
  """
  if any((period - 1 if allow_wrap else period - b.span) < 0
         for b in graph.blocks):
    return ModuloSolution("INFEASIBLE")  # a block longer than the period
  if horizon is None:
    horizon = latency_horizon(graph, period)
  model = cp_model.CpModel()
  v = add_schedule(model, graph, period, horizon, allow_wrap,
                   pooled_devices)
  v = add_memory(model, graph, period, v, memory_limit,
                 minimise=objective == "memory")
  if objective == "latency":
    v = add_latency(model, graph, period, horizon, v)
    model.Minimize(v.last - v.first)
  elif objective == "memory":
    model.Minimize(v.peak)
  if hint is not None and hint.found and objective == "latency":
    add_complete_hint(model, graph, period, hint, v.offset, v.phase,
                      v.order_literals, v.first, v.last,
                      allow_wrap=allow_wrap)
  elif hint is not None and hint.found:
    for var, value in zip(v.offset + v.phase, hint.offsets + hint.phases):
      model.AddHint(var, value)
  # Optimising latency from a hint is fastest with the plain single worker;
  # memory with the LP relaxation; feasibility with the interleaved
  # portfolio (see solve_modulo).
  if linearization_level is None and objective == "memory":
    linearization_level = 2
  solver = make_solver(time_limit_s, seed, num_workers,
                       interleave=objective == "none",
                       linearization_level=linearization_level,
                       cap_s=cap_s)
  if objective == "memory" and stop_at is not None:
    code = solver.Solve(model, StopWithin(stop_at, solver))
  else:
    code = solver.Solve(model)
  return read_solution(solver, code, v,
                       has_objective=objective in ("latency", "memory"))
