"""A repetend as the modulo model returns it, and reading it in pure Python.

``ModuloSolution`` holds a solve's status and, when it found one, the
offsets ``k_b`` and phases ``r_b`` of a repetend (DESIGN.md §3). The
functions here evaluate or improve one without a solver: its steady-state
memory peak, and its offsets pulled in to the earliest the edges allow.
"""

from __future__ import annotations

import dataclasses

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


def normalise(offsets: tuple[int, ...]) -> tuple[int, ...]:
  """Shifts offsets so the smallest is 0 (a whole-period shift is free)."""
  low = min(offsets)
  return tuple(k - low for k in offsets)


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
