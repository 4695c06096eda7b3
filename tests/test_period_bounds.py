"""Period lower bounds from memory: windows (hand-checked, sound) and the
average level."""

from __future__ import annotations

import hypothesis
from hypothesis import strategies as st
import pytest

from tessel_jax import placements, validate
from tessel_jax.graph import Block, BlockGraph, Edge
from tessel_jax.schedule import Repetend, Schedule
from tessel_jax.search import search_repetend
from tessel_jax.search.modulo_model import solve_modulo
from tessel_jax.search.modulo_solution import normalise
from tessel_jax.search.period_bounds import (_least_area, memory_period_bound,
                                             period_lower_bound,
                                             period_upper_bound)
from tessel_jax.search.window_bound import window_period_bound

from test_search import random_placements


@pytest.mark.parametrize("name, devices, limit, expected", [
    # Device 0 holds F1 from its start to B1's end: F1 .. F{D} B{D} .. B1
    # (D + 2D steps) back to back, and the all-device F0 must fit beside.
    ("finetune", 4, 1, 13),
    ("finetune", 32, 1, 97),
    # Device 0's window F1 .. F32 F33 B33 B32 .. B1 (32 + 1 + 3 + 93 + 3 =
    # 132 steps) and the all-device F0 and B0 (1 + 3) beside it.
    ("mllm", 32, 3, 136),
    # Device 0: F9 brings 4 (F0 F4 F5 F9) while the previous micro-batch
    # holds F0 until B0 starts; F9 .. B0 is 31 steps, F4 beside it.
    ("nnshape", 4, 4, 32),
])
def test_window_bound_by_hand(name, devices, limit, expected):
  assert window_period_bound(placements.get(name, devices), limit) == expected


def test_no_limit_or_a_loose_one_gives_no_window():
  graph = placements.get("mllm", 4)
  assert window_period_bound(graph, None) == 1
  assert window_period_bound(graph, 12) == 1  # the fast limit


def test_a_level_that_can_go_negative_gives_no_window():
  # B frees memory before F takes it (no path between them): a micro-batch
  # can hold -1 on device 0, so another one's level proves nothing.
  blocks = (Block(0, "F", 1, 1, (0,)), Block(1, "B", 5, -1, (0,)),
            Block(2, "F", 1, 0, (0,)))
  graph = BlockGraph("negative", 1, blocks, (Edge(0, 2),))
  assert window_period_bound(graph, 1) == 1


def test_tight_limits_are_proven_without_a_solver_proof():
  # mllm at 8 devices, limit 3: one micro-batch at a time (40) is optimal;
  # the bound says so at once, so the first solve finds it and is final.
  graph = placements.get("mllm", 8)
  schedule = search_repetend(graph, memory_limit=3, complete=False,
                             list_alternative=False)
  assert schedule.period == 40 and schedule.status == "OPTIMAL"
  assert schedule.period_lower_bound == 40


@hypothesis.settings(max_examples=60, deadline=None, suppress_health_check=[
    hypothesis.HealthCheck.filter_too_much])
@hypothesis.given(random_placements(), st.integers(0, 2), st.integers(0, 8))
def test_window_bound_never_exceeds_a_valid_repetend(case, delay, slack):
  graph, limit, wrap = case
  limit = 2 if limit is None else limit
  graph = graph.with_delays(delay)
  period = period_lower_bound(graph) + slack
  sol = solve_modulo(graph, period, limit, allow_wrap=wrap, time_limit_s=2.0)
  hypothesis.assume(sol.found)
  # The repetend is valid by the independent validator, so the period is
  # reachable: the bound must not rule it out.
  rep = Repetend(period=period, offsets=normalise(sol.offsets),
                 phases=sol.phases)
  validate.assert_valid(Schedule(graph=graph, repetend=rep,
                                 memory_limit=limit).unroll(
                                     2 * rep.max_offset + 3))
  assert window_period_bound(graph, limit) <= period


@hypothesis.settings(max_examples=40, deadline=None)
@hypothesis.given(random_placements(), st.integers(0, 2), st.integers(1, 4))
def test_average_level_bound_is_the_long_horizon_one(case, delay, limit):
  # memory_period_bound solves each device inside a short horizon first
  # and keeps it when one more step changes nothing: the same bound as the
  # long horizon's.
  graph = case[0].with_delays(delay)
  horizon = period_upper_bound(graph) * (graph.num_blocks + 1)
  expected = 1
  for d in range(graph.num_devices):
    on_d = [b for b in graph.blocks_on(d) if b.memory != 0]
    area = _least_area(graph, on_d, horizon, 5.0) if on_d else None
    if area is not None:
      expected = max(expected, -(-area // limit))
  assert memory_period_bound(graph, limit) == expected
