"""Tests for tessel_jax.simulate: figures on hand-computed cases and bounds."""

from __future__ import annotations

import json

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from chain_case import chain_graph as _chain_graph
from chain_case import random_placements
from tessel_jax.graph import Block, BlockGraph, Edge, make_graph
from tessel_jax.schedule import (Action, UnrolledSchedule,
                                 schedule_in_device_order)
from tessel_jax.simulate import (SimulationStats, critical_path,
                                 device_bounds, lower_bound_makespan,
                                 lower_bound_makespan_shared,
                                 lower_bound_period, shared_device_bounds,
                                 simulate, summary)
from tessel_jax import placements
from tessel_jax.search.list_schedule import best_list_schedule
from tessel_jax.validate import check

_SETTINGS = settings(max_examples=60, deadline=None,
                     suppress_health_check=[HealthCheck.too_slow])



def _chain_schedule() -> UnrolledSchedule:
  actions = [Action(0, 0, 0), Action(1, 0, 1), Action(1, 1, 0),
             Action(2, 1, 1), Action(3, 2, 0), Action(5, 2, 1),
             Action(5, 3, 0), Action(7, 3, 1)]
  return UnrolledSchedule(graph=_chain_graph(), num_microbatches=2,
                          actions=tuple(sorted(actions)), memory_limit=2,
                          source="hand")


def _vshape(devices: int = 4, f: int = 1, b: int = 3) -> BlockGraph:
  """F_i on device i in a chain, then B_{D-1} .. B_0."""
  blocks = [Block(i, "F", f, 1, (i,)) for i in range(devices)]
  blocks += [Block(2 * devices - 1 - i, "B", b, -1, (i,))
             for i in reversed(range(devices))]
  ids = list(range(2 * devices))
  return BlockGraph(name=f"vshape.d{devices}", num_devices=devices,
                    blocks=tuple(blocks),
                    edges=tuple(Edge(a, c) for a, c in zip(ids, ids[1:])))


def test_hand_schedule_figures():
  stats = simulate(_chain_schedule())
  assert isinstance(stats, SimulationStats)
  assert stats.makespan == 9
  assert stats.num_devices == 2
  assert stats.busy_steps == (6, 6)
  assert stats.utilisation == pytest.approx((6 / 9, 6 / 9))
  assert stats.bubble_ratio == pytest.approx(1 / 3)
  assert stats.peak_memory == (2, 2)
  assert stats.memory_timeline == (((0, 1), (1, 2), (5, 1), (7, 0)),
                                   ((1, 1), (2, 2), (3, 1), (5, 0)))
  assert stats.device_timeline == (
      ((0, 1, 0, 0), (1, 2, 0, 1), (5, 7, 3, 0), (7, 9, 3, 1)),
      ((1, 2, 1, 0), (2, 3, 1, 1), (3, 5, 2, 0), (5, 7, 2, 1)))
  json.dumps(stats.to_dict())


def test_multi_device_block_and_negative_peak():
  # One block on both devices frees memory first: peak stays at 0.
  g = make_graph("m", 2, [(0, "B", 2, -1, (0, 1)), (1, "F", 1, 1, (0, 1))],
                 [(0, 1)])
  s = UnrolledSchedule(graph=g, num_microbatches=1,
                       actions=(Action(0, 0, 0), Action(3, 1, 0)))
  stats = simulate(s)
  assert stats.makespan == 4
  assert stats.busy_steps == (3, 3)
  assert stats.bubble_ratio == pytest.approx(2 / 8)
  assert stats.peak_memory == (0, 0)
  assert stats.memory_timeline == (((0, -1), (3, 0)),) * 2


def test_empty_schedule():
  g = make_graph("one", 1, [(0, "F", 1, 0, (0,))])
  stats = simulate(UnrolledSchedule(graph=g, num_microbatches=0, actions=()))
  assert (stats.makespan, stats.bubble_ratio, stats.utilisation) == (
      0, 0.0, (0.0,))


def test_chain_lower_bounds():
  g = _chain_graph()
  # d0: h=0, W=3, t=0; d1: h=1 (after F0), W=3, t=2 (B0 after B1).
  assert device_bounds(g) == ((0, 3, 0), (1, 3, 2))
  assert lower_bound_period(g) == 3
  assert lower_bound_makespan(g, 2) == 9  # the hand schedule is optimal
  assert lower_bound_makespan(g, 10) == 33
  # Delays of 1 on the cross-device edges lengthen head and tail of d1.
  gd = _chain_graph(delay=1)
  assert device_bounds(gd) == ((0, 3, 0), (2, 3, 3))
  assert lower_bound_makespan(gd, 2) == 11
  with pytest.raises(ValueError, match="at least one micro-batch"):
    lower_bound_makespan(g, 0)


def test_vshape_lower_bound_example():
  g = _vshape()
  assert device_bounds(g)[3] == (3, 4, 9)
  assert lower_bound_period(g) == 4
  assert lower_bound_makespan(g, 128) == 524


def test_critical_path_term_for_small_n():
  # A (d0) -> C (d1, 5) -> E (d2, 5) -> D (d0); idle blocks X (d1), Y (d2)
  # give d1 and d2 zero head and tail, so the device bound alone is 6N.
  g = make_graph("long_chain", 3, [
      (0, "F", 1, 0, (0,)), (1, "F", 5, 0, (1,)), (2, "F", 5, 0, (2,)),
      (3, "F", 1, 0, (0,)), (4, "F", 1, 0, (1,)), (5, "F", 1, 0, (2,))],
      [(0, 1), (1, 2), (2, 3)])
  assert critical_path(g) == 12
  assert lower_bound_makespan(g, 1) == 12
  assert lower_bound_makespan(g, 2) == 13
  assert lower_bound_makespan(g, 3) == 18


def test_summary_is_json_and_consistent():
  s = _chain_schedule()
  out = summary(s)
  json.dumps(out)
  assert out["makespan"] == 9
  assert out["lower_bound_makespan"] == 9
  assert out["makespan_over_lower_bound"] == 1.0
  assert out["lower_bound_period"] == 3
  assert out["peak_memory"] == [2, 2]
  assert out["memory_limit"] == 2
  assert out["num_devices"] == 2 and out["num_microbatches"] == 2
  assert out["placement"] == "chain.d2" and out["source"] == "hand"
  assert out["bubble_ratio"] == pytest.approx(1 / 3, abs=1e-6)


# --- property tests ----------------------------------------------------------

@st.composite
def _valid_schedules(draw) -> UnrolledSchedule:
  """Random small F/B placement and a valid device-order schedule."""
  graph = draw(random_placements())
  n = draw(st.integers(1, 5))
  stride = draw(st.integers(1, 4))
  topo = {b: i for i, b in enumerate(graph.topological_order())}
  seq = sorted((Action(0, b.id, m) for b in graph.blocks for m in range(n)),
               key=lambda a: (topo[a.block] + stride * a.microbatch,
                              a.microbatch))
  return UnrolledSchedule(graph=graph, num_microbatches=n,
                          actions=schedule_in_device_order(graph, seq))


@_SETTINGS
@given(_valid_schedules())
def test_lower_bound_never_exceeds_makespan(s):
  assert check(s) == []
  stats = simulate(s)
  n = s.num_microbatches
  assert lower_bound_makespan(s.graph, n) <= stats.makespan
  assert lower_bound_makespan_shared(s.graph, n) <= stats.makespan
  assert lower_bound_period(s.graph) * n <= stats.makespan
  # Agrees with the IR's own (independently written) figures.
  assert stats.makespan == s.makespan
  assert stats.peak_memory == s.peak_memory
  for d in range(s.graph.num_devices):
    assert stats.busy_steps[d] == n * s.graph.device_load(d)
    assert 0.0 <= stats.utilisation[d] <= 1.0
    levels = [lvl for _, lvl in stats.memory_timeline[d]]
    assert max(levels, default=0) <= stats.peak_memory[d]
    assert not levels or levels[-1] == 0  # every allocation is freed
  assert 0.0 <= stats.bubble_ratio < 1.0


@_SETTINGS
@given(random_placements(), st.integers(1, 6))
def test_shared_bound_never_exceeds_a_greedy_schedule(graph, n):
  actions = best_list_schedule(graph, n, None)
  run = UnrolledSchedule(graph=graph, num_microbatches=n, actions=actions)
  assert check(run) == []
  assert lower_bound_makespan(graph, n) <= lower_bound_makespan_shared(graph, n)
  assert lower_bound_makespan_shared(graph, n) <= run.makespan


@pytest.mark.parametrize("devices, bound", [(8, 1052), (16, 1084), (32, 1148)])
def test_shared_bound_is_met_on_mshape(devices, bound):
  # F0 on every device, then a V over the devices: the last device idles
  # while the first micro-batch's forward chain passes and while the last
  # one's backward chain drains. The bound is met by the list schedule.
  graph = placements.mshape(devices)
  assert lower_bound_makespan(graph, 128) == 1024
  assert lower_bound_makespan_shared(graph, 128) == bound
  h, w, t = shared_device_bounds(graph)[-1]
  assert (h, w, t) == (devices - 1, 8, 3 * (devices - 1))
  run = UnrolledSchedule(graph=graph, num_microbatches=128,
                         actions=best_list_schedule(graph, 128, None))
  assert check(run) == [] and run.makespan == bound
