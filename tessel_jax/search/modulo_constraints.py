"""The variables and constraints of the modulo model (``modulo_model``).

Each ``add_*`` adds one rule to a CP-SAT model and returns the model's
variables (``ModelVars``); ``read_solution`` turns the solver's answer into
a ``ModuloSolution``. The rules are added in a fixed order, so the same
input gives CP-SAT the same model.
"""

from __future__ import annotations

from typing import Any, NamedTuple

from ortools.sat.python import cp_model

from tessel_jax.graph import BlockGraph
from tessel_jax.search.cpsat import integer_bound
from tessel_jax.search.modulo_solution import ModuloSolution


def latency_horizon(graph: BlockGraph, period: int) -> int:
  """Upper bound on the start of any block in the micro-batch frame."""
  spans = sum(b.span for b in graph.blocks)
  delays = sum(e.delay for e in graph.edges)
  return period * (graph.num_blocks + 1) + spans + delays


class ModelVars(NamedTuple):
  """The modulo model's variables (``modulo_model``), per block in the
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


def add_schedule(model: cp_model.CpModel, graph: BlockGraph, period: int,
                 horizon: int, allow_wrap: bool,
                 pooled_devices: tuple[int, ...]) -> ModelVars:
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
  # Symmetry. With wrap-around, rotating all phases is free, so one block
  # is pinned at phase 0. Without it a rotation can carry a block across
  # the end of the period, so the pin is the smallest phase instead: every
  # repetend without wrap-around, its phases all lowered by their minimum,
  # is one still (pinning a block there ruled out repetends, and made the
  # relaxations' proofs of infeasibility wrong: tests/test_relaxation.py).
  if allow_wrap:
    model.Add(phase[pos[graph.topological_order()[0]]] == 0)
  else:
    model.AddMinEquality(0, phase)
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
  return ModelVars(phase, offset, start, limited_devices, max_offset)


def add_memory(model: cp_model.CpModel, graph: BlockGraph, period: int,
               v: ModelVars, memory_limit: int | None, *,
               minimise: bool) -> ModelVars:
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


def add_latency(model: cp_model.CpModel, graph: BlockGraph, period: int,
                horizon: int, v: ModelVars) -> ModelVars:
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


def add_complete_hint(model: cp_model.CpModel, graph: BlockGraph,
                      period: int, hint: "ModuloSolution", offset: list,
                      phase: list, order_literals: list,
                      first: cp_model.IntVar,
                      last: cp_model.IntVar, *, allow_wrap: bool = True
                      ) -> None:
  """Hints a latency solve with all of ``hint``, a repetend at ``period``.

  Every variable is hinted (the phase order literals and the latency's
  ends too), after rotating the repetend as the symmetry pin wants (its
  block at phase 0; without ``allow_wrap``, the smallest phase at 0), so CP-SAT loads it as a solution (a valid repetend within the
  model's horizon) and a short solve returns it or better. With only
  offsets and phases hinted, 0.012 deterministic s on mllm (4 devices,
  limit 12, P = 12) returned latency 96 from a start of 72; hinted in
  full, 68.
  """
  pin = (hint.phases[graph.index(graph.topological_order()[0])]
         if allow_wrap else min(hint.phases))  # the symmetry pin's rotation
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


def read_solution(solver: cp_model.CpSolver, code: int, v: ModelVars, *,
                  has_objective: bool) -> ModuloSolution:
  """The solve's answer as a ``ModuloSolution``."""
  status = solver.StatusName(code)
  work = solver.ResponseProto().deterministic_time
  if code not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
    # A bound can be proven before any solution is found (the early stop
    # fires on it); it still decides a limit.
    bound = (integer_bound(solver)
             if has_objective and code == cp_model.UNKNOWN else None)
    return ModuloSolution(status, bound=bound, seconds=solver.WallTime(),
                          work=work)
  return ModuloSolution(
      status=status,
      offsets=tuple(solver.Value(k) for k in v.offset),
      phases=tuple(solver.Value(r) for r in v.phase),
      objective=int(solver.ObjectiveValue()) if has_objective else None,
      bound=integer_bound(solver) if has_objective else None,
      seconds=solver.WallTime(), work=work)
