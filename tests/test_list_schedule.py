"""List scheduling of all N micro-batches, and its use by Schedule.unroll."""

from __future__ import annotations

import hypothesis
from hypothesis import strategies as st

from chain_case import random_placements
from tessel_jax import placements, simulate, validate
from tessel_jax.schedule import UnrolledSchedule
from tessel_jax.search import search_repetend
from tessel_jax.search import list_schedule as ls


def _unrolled(graph, n, actions, limit):
  return UnrolledSchedule(graph=graph, num_microbatches=n, actions=actions,
                          memory_limit=limit)


def test_tail_rule_without_limit_is_gpipe_optimal_on_vshape():
  graph = placements.vshape(4)  # F=1, B=3
  actions = ls.list_schedule(graph, 8, None, "tail")
  run = _unrolled(graph, 8, actions, None)
  validate.assert_valid(run)
  # GPipe: every forward first; the bound is met exactly.
  assert run.makespan == simulate.lower_bound_makespan(graph, 8)
  assert max(run.peak_memory) == 8


def test_memory_limit_is_honoured_or_none():
  graph = placements.vshape(4)
  actions = ls.list_schedule(graph, 16, 4, "microbatch")
  run = _unrolled(graph, 16, actions, 4)
  validate.assert_valid(run)
  assert max(run.peak_memory) <= 4


def test_unknown_rule_names_the_choices():
  try:
    ls.list_schedule(placements.vshape(2), 2, None, "random")
  except ValueError as err:
    assert "tail" in str(err) and "microbatch" in str(err)
  else:
    raise AssertionError("no error")


@hypothesis.settings(max_examples=40, deadline=None)
@hypothesis.given(random_placements(), st.integers(1, 9),
                  st.sampled_from(ls.PRIORITIES), st.integers(0, 6))
def test_random_placements_valid_or_stuck(graph, n, rule, extra):
  limit = max([b.memory for b in graph.blocks] + [0]) + extra
  actions = ls.list_schedule(graph, n, limit, rule)
  if actions is None:
    return  # stuck on memory: allowed, the repetend is used then
  run = _unrolled(graph, n, actions, limit)
  validate.assert_valid(run)
  assert len(run.actions) == n * graph.num_blocks


def test_unroll_keeps_the_shorter_of_repetend_and_list():
  graph = placements.alphafold(16)
  schedule = search_repetend(graph, None, time_limit_s=5)
  run = schedule.unroll(128)
  validate.assert_valid(run)
  periodic = search_repetend(graph, None, time_limit_s=5,
                             list_alternative=False).unroll(128)
  listed = ls.best_list_schedule(graph, 128, None)
  listed_end = _unrolled(graph, 128, listed, None).makespan
  assert run.makespan == min(periodic.makespan, listed_end)
  assert run.makespan < periodic.makespan  # alphafold: GPipe-like wins
  assert run.source == "tessel-list" and run.period is None


def test_unroll_keeps_the_repetend_on_ties():
  graph = placements.vshape(4)
  run = search_repetend(graph, 4, time_limit_s=5).unroll(32)
  assert run.source == "tessel" and run.period == 4
