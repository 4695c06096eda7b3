"""Bounds on the period of a repetend: the busiest device's load, the
average memory level under a limit, and a period at which every
memory-feasible placement has a repetend."""

from __future__ import annotations

from ortools.sat.python import cp_model

from tessel_jax.graph import BlockGraph
from tessel_jax.search.cpsat import make_solver


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
             sum(b.span for b in graph.blocks)
             + sum(e.delay for e in graph.edges))
