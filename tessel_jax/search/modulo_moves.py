"""Repetends built or moved without a solver.

``one_at_a_time`` runs one micro-batch at a time (a repetend that fits
wherever any does); ``moved_to_period`` carries a repetend's start times to
another period (a hint for a solve there); ``drop_idle_steps`` shortens a
repetend by the steps idle on every device.
"""

from __future__ import annotations

import bisect
import dataclasses

from tessel_jax.graph import BlockGraph
from tessel_jax.schedule import Repetend
from tessel_jax.search.modulo_solution import ModuloSolution, steady_peak


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
