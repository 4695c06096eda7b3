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
"""

from __future__ import annotations

import bisect
import dataclasses
import math
import time
from typing import Any, NamedTuple

from ortools.sat.python import cp_model

from tessel_jax.graph import BlockGraph
from tessel_jax.schedule import Repetend


@dataclasses.dataclass(frozen=True)
class ModuloSolution:
  """Result of one solve of the modulo model.

  Attributes:
    status: CP-SAT status name (``OPTIMAL``, ``FEASIBLE``, ``INFEASIBLE``,
      ``UNKNOWN``, ``MODEL_INVALID``).
    offsets: ``k_b`` per block in graph order (empty unless a solution).
    phases: ``r_b`` per block in graph order (empty unless a solution).
    objective: Objective value (latency or memory), None if no objective.
    bound: CP-SAT's proven bound on the objective (also when the search
      stopped on it before any solution).
    seconds: Wall time of the solve.
    work: CP-SAT deterministic time of the solve (reproducible).
  """

  status: str
  offsets: tuple[int, ...] = ()
  phases: tuple[int, ...] = ()
  objective: int | None = None
  bound: int | None = None
  seconds: float = 0.0
  work: float = 0.0

  @property
  def found(self) -> bool:
    return self.status in ("OPTIMAL", "FEASIBLE")


def earliest_offsets(graph: BlockGraph, period: int,
                     phases: tuple[int, ...]) -> tuple[int, ...]:
  """The smallest offsets ``k_b`` the edges allow with ``phases`` fixed.

  In topological order each block takes the first period at whose phase
  ``r_b`` all its inputs have arrived. For the given phases this gives every
  block its earliest start, hence the shortest latency; the device
  constraints depend only on phases and still hold. Pure Python, linear in
  the graph (a solver's first feasible repetend often has offsets spread
  over hundreds of periods; this pulls them in).
  """
  offsets = [0] * graph.num_blocks
  for bid in graph.topological_order():
    i = graph.index(bid)
    for e in graph.predecessors(bid):
      j = graph.index(e.src)
      arrival = (offsets[j] * period + phases[j] + graph.blocks[j].span
                 + e.delay)
      offsets[i] = max(offsets[i], -(-(arrival - phases[i]) // period))
  return tuple(offsets)


def steady_peak(graph: BlockGraph, period: int, phases: tuple[int, ...],
                offsets: tuple[int, ...]) -> int:
  """Largest steady-state memory level of any device (DESIGN §3).

  Device ``d`` at phase ``t`` holds ``sum_b m_b [r_b <= t] - sum_b m_b k_b``
  over its blocks (the model's memory constraint, evaluated directly).
  """
  peak = 0
  for d in range(graph.num_devices):
    on_d = [i for i, b in enumerate(graph.blocks)
            if d in b.devices and b.memory != 0]
    level = -sum(graph.blocks[i].memory * offsets[i] for i in on_d)
    for t in sorted({phases[i] for i in on_d}):
      peak = max(peak, level + sum(graph.blocks[i].memory for i in on_d
                                   if phases[i] <= t))
  return peak


def pull_in(graph: BlockGraph, period: int, memory_limit: int | None,
            sol: "ModuloSolution") -> "ModuloSolution":
  """``sol`` with ``earliest_offsets`` where that shortens its latency and
  keeps its memory within the limit; else ``sol`` unchanged."""
  if not sol.found:
    return sol
  offsets = earliest_offsets(graph, period, sol.phases)
  spans = [b.span for b in graph.blocks]
  if (Repetend(period, offsets, sol.phases).latency(spans) >=
      Repetend(period, sol.offsets, sol.phases).latency(spans)):
    return sol
  if (memory_limit is not None and
      steady_peak(graph, period, sol.phases, offsets) > memory_limit):
    return sol
  return dataclasses.replace(sol, offsets=offsets)


def one_at_a_time(graph: BlockGraph) -> tuple[int, "ModuloSolution"]:
  """The repetend that runs one micro-batch at a time.

  Blocks run back to back, each as soon as the one before it has ended and
  its inputs have arrived; the next micro-batch starts when the last block
  ends, which is the period. A device then holds at most one micro-batch's
  memory, and how much depends on the order: of two orders (the graph's
  topological order, and depth first, which finishes a branch such as one
  V of xshape before starting the next) the one with the lower peak is
  kept, then the shorter. Pure Python, ``O(blocks * edges)``.

  Returns:
    ``(period, solution)`` with every offset 0.
  """
  candidates = []
  for order in (graph.topological_order(), _depth_first_order(graph)):
    period, sol = _back_to_back(graph, order)
    peak = steady_peak(graph, period, sol.phases, sol.offsets)
    candidates.append((peak, period, sol))
  _, period, sol = min(candidates, key=lambda c: c[:2])
  return period, sol


def _depth_first_order(graph: BlockGraph) -> tuple[int, ...]:
  """A topological order that runs next a block whose input was produced
  last (ties by position in the graph)."""
  waiting = {b.id: len(graph.predecessors(b.id)) for b in graph.blocks}
  enabled_at = {bid: -1 for bid, n in waiting.items() if n == 0}
  order = []
  while enabled_at:
    bid = max(enabled_at, key=lambda b: (enabled_at[b], -graph.index(b)))
    del enabled_at[bid]
    order.append(bid)
    for e in graph.successors(bid):
      waiting[e.dst] -= 1
      if waiting[e.dst] == 0:
        enabled_at[e.dst] = len(order)
  return tuple(order)


def _back_to_back(graph: BlockGraph, order: tuple[int, ...]
                  ) -> tuple[int, "ModuloSolution"]:
  """One micro-batch's blocks in ``order``, each as early as the previous
  block's end and its inputs allow; the period is the last end."""
  phases = [0] * graph.num_blocks
  clock = 0
  for bid in order:
    i = graph.index(bid)
    ready = max((phases[graph.index(e.src)] + graph.block(e.src).span
                 + e.delay for e in graph.predecessors(bid)), default=0)
    phases[i] = max(clock, ready)
    clock = phases[i] + graph.blocks[i].span
  return clock, ModuloSolution("FEASIBLE", offsets=(0,) * graph.num_blocks,
                               phases=tuple(phases))


def moved_to_period(graph: BlockGraph, period: int, sol: "ModuloSolution",
                    target: int) -> "ModuloSolution":
  """``sol``'s start times in the frame of one micro-batch, taken modulo
  another period: a hint for a solve at ``target``.

  Every edge still holds (the starts are unchanged); blocks may collide
  across micro-batches and memory may exceed the limit, which CP-SAT
  repairs from the hint far faster than it finds a repetend from nothing
  (zbv, 16 devices, limit 4, from one micro-batch at a time: P = 159, 130,
  112 and 102 found in 0.01 deterministic seconds where 4 s found nothing,
  and P = 96 proven infeasible in 1.2 s instead of 2.5 s). The starts are
  shifted so the first block in topological order, whose phase the model
  pins at 0, starts at a multiple of ``target``, and no offset is negative.
  """
  starts = _starts(period, sol)
  shift = starts[graph.index(graph.topological_order()[0])]
  starts = [t - shift for t in starts]
  lowest = min(starts)
  if lowest < 0:
    starts = [t + target * -(lowest // target) for t in starts]
  return ModuloSolution("FEASIBLE", offsets=tuple(t // target for t in starts),
                        phases=tuple(t % target for t in starts))


def drop_idle_steps(graph: BlockGraph, period: int, sol: "ModuloSolution"
                    ) -> tuple[int, "ModuloSolution"]:
  """A shorter repetend: ``sol`` without the steps of the period that no
  block occupies on any device.

  Removing the same step from every period maps the endless modulo
  schedule onto one with period ``period - 1`` by a non-decreasing change
  of time that is the identity on every block's run, so blocks on a device
  stay apart and in order, the memory levels keep their sequence and
  edges with no delay stay satisfied; a step is kept where removing it
  would cut an edge's delay short. Pure Python, ``O(period * edges)``.

  Returns:
    ``(period, sol)``: the shorter period and its solution (the input
    unchanged when no step can go).
  """
  if not sol.found:
    return period, sol
  spans = [b.span for b in graph.blocks]
  busy = [False] * period
  for phase, span in zip(sol.phases, spans):
    for t in range(phase, phase + span):
      busy[t % period] = True
  starts = _starts(period, sol)
  edges = [(graph.index(e.src), graph.index(e.dst), e.delay)
           for e in graph.edges]

  def moved(t: int, removed: list[int]) -> int:
    """Time ``t`` (>= 0) once every step in ``removed`` (sorted phases) is
    gone from every period before it."""
    return (t - (t // period) * len(removed)
            - bisect.bisect_left(removed, t % period))

  removed: list[int] = []  # ascending, as the steps are tried
  for step in (t for t in range(period) if not busy[t]):
    trial = removed + [step]
    if all(moved(starts[j], trial) >= moved(starts[i], trial) + spans[i] + delay
           for i, j, delay in edges):
      removed = trial
  if not removed or len(removed) == period:
    return period, sol
  shorter = period - len(removed)
  new_starts = [moved(t, removed) for t in starts]
  return shorter, dataclasses.replace(
      sol, offsets=tuple(t // shorter for t in new_starts),
      phases=tuple(t % shorter for t in new_starts), objective=None,
      bound=None)


def _starts(period: int, sol: "ModuloSolution") -> list[int]:
  """Each block's start in the frame of one micro-batch, in graph order."""
  rep = Repetend(period, sol.offsets, sol.phases)
  return [rep.start_in_microbatch_frame(i) for i in range(len(sol.phases))]


def latency_horizon(graph: BlockGraph, period: int) -> int:
  """Upper bound on the start of any block in the micro-batch frame."""
  spans = sum(b.span for b in graph.blocks)
  delays = sum(e.delay for e in graph.edges)
  return period * (graph.num_blocks + 1) + spans + delays


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
                 wall_limit_s: float | None = None,
                 proof_only: bool = False) -> ModuloSolution:
  """Builds and solves the modulo model at ``period``.

  The solver strategy depends on the question (measured on this project's
  placements; every stage is limited in deterministic time, so the outcome
  depends only on the input and the seed):

  * feasibility with no memory limit: CP-SAT's interleaved portfolio, which
    finds repetends in milliseconds;
  * feasibility under a limit, in stages until one decides: the
    interleaved portfolio for 0.2 s; memory minimisation with no LP
    (``linearization_level=0``) for 0.2 s, stopped as soon as a repetend
    within the limit is found (nnshape, 16 devices, limit 4, at the
    largest period: found in 0.3 s, where the portfolio found nothing in
    15 s and the LP-guided search below nothing in 12 s); then, for the
    rest of the budget, memory minimisation with the full LP relaxation
    (``linearization_level=2``), stopped at a repetend within the limit
    (feasible) or a proven bound above it (infeasible). The last stage
    decides what the others cannot when the limit binds: nnshape, 4
    devices, limit 4, P = 31 proven infeasible in 1.1 s; zbv, 8 devices,
    limit 4: P = 49 proven infeasible in 0.4 s and P = 50 found in 0.6 s,
    where the portfolio gave UNKNOWN after 10 s each;
  * ``"memory"``: the same LP-guided single worker (5-50x faster than the
    portfolio at proving the smallest limit);
  * ``"latency"``: the plain single worker from the hint (interleaved was
    150x slower on 8-device vshape).

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
    wall_limit_s: Wall-clock seconds for all stages together (a safety net
      on a loaded machine; the period search passes what its own wall cap
      leaves). None: ``_WALL_PER_DETERMINISTIC_S`` times each stage's
      budget.
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
                       time_limit_s=time_limit_s, wall_limit_s=wall_limit_s,
                       **kw)
  deadline = (None if wall_limit_s is None
              else time.perf_counter() + wall_limit_s)
  used = seconds = 0.0
  sol = ModuloSolution("UNKNOWN")
  stages = _STAGES[-1:] if proof_only else _STAGES
  for i, (stage_objective, level) in enumerate(stages):
    if deadline is not None:
      kw["wall_limit_s"] = deadline - time.perf_counter()
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
    stopped_by_wall_clock = sol.work < 0.99 * limit
    if sol.status != "UNKNOWN" or stopped_by_wall_clock:
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
                wall_limit_s: float | None = None) -> ModuloSolution:
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
  v = _add_schedule(model, graph, period, horizon, allow_wrap,
                    pooled_devices)
  v = _add_memory(model, graph, period, v, memory_limit,
                  minimise=objective == "memory")
  if objective == "latency":
    v = _add_latency(model, graph, period, horizon, v)
    model.Minimize(v.last - v.first)
  elif objective == "memory":
    model.Minimize(v.peak)
  if hint is not None and hint.found and objective == "latency":
    _add_complete_hint(model, graph, period, hint, v.offset, v.phase,
                       v.order_literals, v.first, v.last)
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
                       wall_limit_s=wall_limit_s)
  if objective == "memory" and stop_at is not None:
    code = solver.Solve(model, _StopWithin(stop_at, solver))
  else:
    code = solver.Solve(model)
  return _read_solution(solver, code, v,
                        has_objective=objective in ("latency", "memory"))


class _ModelVars(NamedTuple):
  """The modulo model's variables (``_solve_once``), per block in the
  graph's order: phase ``r_b``, offset ``k_b`` and start
  ``s_b = k_b P + r_b`` (an expression); the phase-order literals of the
  memory rule ``(a, b, literal)``; the peak (memory objective) and the
  latency's two ends (latency objective), None where absent."""

  phase: list
  offset: list
  start: list
  limited_devices: list[int]
  max_offset: int
  order_literals: list | tuple = ()
  peak: Any = None
  first: Any = None
  last: Any = None


def _add_schedule(model: cp_model.CpModel, graph: BlockGraph, period: int,
                  horizon: int, allow_wrap: bool,
                  pooled_devices: tuple[int, ...]) -> _ModelVars:
  """Variables, dependencies, the symmetry pin and the one-block-at-a-time
  rule (``pooled_devices`` share one pool of slots instead)."""
  blocks = graph.blocks
  max_offset = horizon // period + 1
  phase, offset, start = [], [], []
  for b in blocks:
    last_phase = period - 1 if allow_wrap else period - b.span
    phase.append(model.NewIntVar(0, last_phase, f"r_{b.id}"))
    offset.append(model.NewIntVar(0, max_offset, f"k_{b.id}"))
    start.append(offset[-1] * period + phase[-1])
  pos = {b.id: i for i, b in enumerate(blocks)}
  # Dependencies inside one micro-batch.
  for e in graph.edges:
    src, dst = pos[e.src], pos[e.dst]
    model.Add(start[dst] >= start[src] + blocks[src].span + e.delay)
  # Symmetry: rotating all phases is free, so pin one block at phase 0.
  model.Add(phase[pos[graph.topological_order()[0]]] == 0)
  # One block at a time per device, modulo P.
  intervals = []
  for i, b in enumerate(blocks):
    copies = [model.NewFixedSizeIntervalVar(phase[i], b.span, f"I_{b.id}")]
    if allow_wrap:
      copies.append(model.NewFixedSizeIntervalVar(
          phase[i] + period, b.span, f"I_{b.id}_next"))
    intervals.append(copies)
  limited_devices = [d for d in range(graph.num_devices)
                     if d not in pooled_devices]
  for d in limited_devices:
    on_d = [i for i, b in enumerate(blocks) if d in b.devices]
    model.AddNoOverlap([iv for i in on_d for iv in intervals[i]])
  if pooled_devices:
    slots = [len(set(b.devices) & set(pooled_devices)) for b in blocks]
    model.AddCumulative(
        [iv for i in range(len(blocks)) if slots[i] for iv in intervals[i]],
        [slots[i] for i in range(len(blocks)) if slots[i]
         for _ in intervals[i]],
        len(pooled_devices))
  return _ModelVars(phase, offset, start, limited_devices, max_offset)


def _add_memory(model: cp_model.CpModel, graph: BlockGraph, period: int,
                v: _ModelVars, memory_limit: int | None, *,
                minimise: bool) -> _ModelVars:
  """The steady-state memory rule per limited device: under
  ``memory_limit``, or under a new ``peak`` variable when ``minimise``."""
  blocks, phase, offset, start = graph.blocks, v.phase, v.offset, v.start
  earlier: dict[tuple[int, int], cp_model.IntVar] = {}
  order_literals: list[tuple[int, int, cp_model.IntVar]] = []

  def starts_earlier(a: int, b: int) -> cp_model.IntVar:
    """Boolean: block a has a smaller phase than block b (same device)."""
    if (a, b) not in earlier:
      lit = model.NewBoolVar(f"before_{blocks[a].id}_{blocks[b].id}")
      model.Add(phase[a] + 1 <= phase[b]).OnlyEnforceIf(lit)
      model.Add(phase[b] + 1 <= phase[a]).OnlyEnforceIf(lit.Not())
      earlier[(a, b)] = lit
      earlier[(b, a)] = lit.Not()
      order_literals.append((a, b, lit))
    return earlier[(a, b)]

  peak = None
  if minimise:
    bound = sum(abs(b.memory) for b in blocks) * (v.max_offset + 1)
    peak = model.NewIntVar(0, bound, "peak_memory")
  limit = peak if peak is not None else memory_limit
  for d in v.limited_devices:
    on_d = [i for i, b in enumerate(blocks)
            if d in b.devices and b.memory != 0]
    if not on_d:
      continue
    in_flight = -sum(blocks[i].memory * offset[i] for i in on_d)
    # Redundant but strong: the level averaged over one period is
    # -sum_b m_b s_b / P (each block's memory is held from its start on) and
    # cannot exceed the peak. Lets CP-SAT prove small periods infeasible fast.
    if limit is not None:
      model.Add(-sum(blocks[i].memory * start[i] for i in on_d)
                <= limit * period)
    for a in on_d:
      if blocks[a].memory <= 0:
        continue
      # The phase-order literals exist with no limit too (latency hints
      # set them).
      level = blocks[a].memory + in_flight + sum(
          blocks[b].memory * starts_earlier(b, a) for b in on_d if b != a)
      if limit is not None:
        model.Add(level <= limit)
  return v._replace(order_literals=order_literals, peak=peak)


def _add_latency(model: cp_model.CpModel, graph: BlockGraph, period: int,
                 horizon: int, v: _ModelVars) -> _ModelVars:
  """The latency's two ends: ``first`` at most every start, ``last`` at
  least every end. One-sided bounds suffice (minimising pulls ``first`` up
  to the earliest start and ``last`` down to the latest end) and, unlike
  min/max equalities, are linear, so the LP relaxation bounds latency."""
  blocks = graph.blocks
  first = model.NewIntVar(0, horizon, "first_start")
  last = model.NewIntVar(0, horizon + period + max(b.span for b in blocks),
                         "last_end")
  for i, b in enumerate(blocks):
    model.Add(first <= v.start[i])
    model.Add(last >= v.start[i] + b.span)
  return v._replace(first=first, last=last)


def _read_solution(solver: cp_model.CpSolver, code: int, v: _ModelVars, *,
                   has_objective: bool) -> ModuloSolution:
  """The solve's answer as a ``ModuloSolution``."""
  status = solver.StatusName(code)
  work = solver.ResponseProto().deterministic_time
  if code not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
    # A bound can be proven before any solution is found (the early stop
    # fires on it); it still decides a limit.
    bound = (_integer_bound(solver)
             if has_objective and code == cp_model.UNKNOWN else None)
    return ModuloSolution(status, bound=bound, seconds=solver.WallTime(),
                          work=work)
  return ModuloSolution(
      status=status,
      offsets=tuple(solver.Value(k) for k in v.offset),
      phases=tuple(solver.Value(r) for r in v.phase),
      objective=int(solver.ObjectiveValue()) if has_objective else None,
      bound=_integer_bound(solver) if has_objective else None,
      seconds=solver.WallTime(), work=work)


def _add_complete_hint(model: cp_model.CpModel, graph: BlockGraph,
                       period: int, hint: "ModuloSolution", offset: list,
                       phase: list, order_literals: list,
                       first: cp_model.IntVar,
                       last: cp_model.IntVar) -> None:
  """Hints a latency solve with all of ``hint``, a repetend at ``period``.

  Every variable is hinted (the phase order literals and the latency's
  ends too), after rotating the repetend so the symmetry pin's block is at
  phase 0, so CP-SAT loads it as a solution (a valid repetend within the
  model's horizon) and a short solve returns it or better. With only
  offsets and phases hinted, 0.012 deterministic s on mllm (4 devices,
  limit 12, P = 12) returned latency 96 from a start of 72; hinted in
  full, 68.
  """
  pin = hint.phases[graph.index(graph.topological_order()[0])]
  starts = [k * period + r - pin for k, r in zip(hint.offsets, hint.phases)]
  shift = min(starts) // period * period  # smallest offset back to 0
  starts = [s - shift for s in starts]
  for i, s in enumerate(starts):
    model.AddHint(offset[i], s // period)
    model.AddHint(phase[i], s % period)
  for a, b, lit in order_literals:
    model.AddHint(lit, starts[a] % period < starts[b] % period)
  model.AddHint(first, min(starts))
  model.AddHint(last, max(s + b.span for s, b in zip(starts, graph.blocks)))


def _integer_bound(solver: cp_model.CpSolver) -> int | None:
  """CP-SAT's bound on an integer objective being minimised, rounded up
  (a bound of 4.3 proves 5; a tolerance keeps 5.0000001 at 5); None when
  CP-SAT has no finite bound."""
  bound = solver.BestObjectiveBound()
  return math.ceil(bound - 1e-6) if math.isfinite(bound) else None


class _StopWithin(cp_model.CpSolverSolutionCallback):
  """Stops a memory minimisation once its answer relative to ``limit`` is
  known: a solution with peak ``<= limit``, or a bound above it."""

  def __init__(self, limit: int, solver: cp_model.CpSolver):
    super().__init__()
    self._limit = limit
    solver.best_bound_callback = self._on_bound

  def on_solution_callback(self) -> None:
    if self.ObjectiveValue() <= self._limit:
      self.StopSearch()

  def _on_bound(self, bound: float) -> None:
    if math.isfinite(bound) and math.ceil(bound - 1e-6) > self._limit:
      self.StopSearch()


# Wall-clock seconds a solve may take per deterministic second before the
# safety net cuts it (``make_solver``). On this project's 2-core machine the
# LP-guided solves take 2.5-4.7 wall s per deterministic s when it is quiet
# and more beside a second job, so at 4 the net could cut them: nnshape (4
# devices, limit 13) missed P = 16 in a benchmark run beside another and
# found it alone (its first solve, 1.9 deterministic s, took 4.2-5.2 s of
# wall time quiet, against a net of 8.5 s). The period search's own cap
# (twice its budget) still bounds the whole search.
_WALL_PER_DETERMINISTIC_S = 8


def make_solver(time_limit_s: float, seed: int, num_workers: int,
                interleave: bool = True,
                linearization_level: int | None = None,
                wall_limit_s: float | None = None) -> cp_model.CpSolver:
  """A CP-SAT solver whose result depends only on the model and the seed.

  Subsolvers are interleaved deterministically (``interleave_search``) and
  the cut-off is CP-SAT's deterministic time; wall time is limited too, at
  ``_WALL_PER_DETERMINISTIC_S`` times the budget (plus 1 s) or
  ``wall_limit_s`` if less, as a safety net.
  Measured on vshape with 16 and 32 devices: with ``interleave_search`` one
  worker finds feasible repetends at large periods in milliseconds where
  the default single worker needs tens of seconds, and more interleaved
  workers were 8x slower in total. The
  completion models (thousands of hinted actions) are 30x faster without it
  (``interleave=False``). ``linearization_level=2`` adds the full LP
  relaxation (see ``solve_modulo``).
  """
  solver = cp_model.CpSolver()
  solver.parameters.max_deterministic_time = max(0.01, time_limit_s)
  wall = _WALL_PER_DETERMINISTIC_S * max(0.01, time_limit_s) + 1
  if wall_limit_s is not None:
    wall = min(wall, max(0.01, wall_limit_s))
  solver.parameters.max_time_in_seconds = wall
  solver.parameters.random_seed = seed
  solver.parameters.num_workers = num_workers
  solver.parameters.interleave_search = interleave
  if linearization_level is not None:
    solver.parameters.linearization_level = linearization_level
  return solver


def normalise(offsets: tuple[int, ...]) -> tuple[int, ...]:
  """Shifts offsets so the smallest is 0 (a whole-period shift is free)."""
  low = min(offsets)
  return tuple(k - low for k in offsets)

