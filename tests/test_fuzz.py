"""Fuzz slice: random placements searched, unrolled and checked twice.

The full run is ``python -m experiments.fuzz --cases=N`` (BENCHMARKS.md);
here a 200-case slice of small placements keeps the suite fast.
"""

import dataclasses
import random

import pytest
from hypothesis import given, settings, strategies as st

from experiments import fuzz_lib
from tessel_jax import placements, validate
from tessel_jax.graph import BlockGraph
from tessel_jax.schedule import Action, concatenate
from tessel_jax.search import InfeasibleScheduleError, search_repetend

SLICE = fuzz_lib.FuzzArgs(time_limit=0.2, microbatches=(1, 2, 3),
                          max_forwards=3)


@settings(max_examples=200, deadline=None, derandomize=True)
@given(st.integers(0, 10**9))
def test_fuzz_slice_has_no_invalid_schedule_raw_error_or_longer_split(index):
  case = fuzz_lib.run_case(index, SLICE)
  assert case["raw_error"] is None, case
  assert not case["invalid"], case
  assert not case["recheck_failed"], case
  assert not case["split_longer"], case


def test_independent_check_finds_every_kind_of_broken_schedule():
  graph = placements.get("vshape", 2)
  unrolled = search_repetend(graph, 2).unroll(3)
  good = fuzz_lib.triples(unrolled)
  assert fuzz_lib.independent_check(graph, 3, 2, good) == []
  first = min(good, key=lambda t: t[2])
  broken = {
      "missing": good[1:],
      "twice": good + [good[0]],
      "early": [(b, m, s - 1 if (b, m, s) != first else s)
                for b, m, s in good],
      "memory": good,  # checked against a smaller limit below
  }
  assert fuzz_lib.independent_check(graph, 3, 2, broken["missing"])
  assert fuzz_lib.independent_check(graph, 3, 2, broken["twice"])
  assert fuzz_lib.independent_check(graph, 3, 2, broken["early"])
  assert fuzz_lib.independent_check(graph, 3, 1, broken["memory"])
  # Agrees with the library's validator on each mutation.
  for name in ("missing", "early"):
    actions = tuple(Action(s, b, m) for b, m, s in broken[name])
    with pytest.raises(validate.ScheduleValidationError):
      validate.assert_valid(dataclasses.replace(unrolled, actions=actions))


@settings(max_examples=30, deadline=None, derandomize=True)
@given(st.integers(0, 10**9), st.integers(2, 5))
def test_unroll_is_never_longer_than_a_split(seed, n):
  rng = random.Random(seed)
  graph = fuzz_lib.random_graph(rng, max_forwards=3)
  limit = fuzz_lib.random_limit(rng, graph)
  try:
    sched = search_repetend(graph, limit, allow_wrap=rng.random() < 0.5,
                            time_limit_s=0.2)
  except InfeasibleScheduleError:  # nothing to compare
    return
  whole = sched.unroll(n)
  for a in range(1, n):
    joined = concatenate(sched.unroll(a), sched.unroll(n - a))
    validate.assert_valid(joined)
    assert whole.makespan <= joined.makespan


def test_concatenation_is_valid_and_compacted():
  graph = placements.get("mshape", 4)
  sched = search_repetend(graph, 6)
  one = sched.unroll(1)
  two = concatenate(one, one)
  validate.assert_valid(two)
  assert two.num_microbatches == 2 and two.source.endswith("-split")
  assert two.makespan <= 2 * one.makespan
  assert sched.unroll(2).makespan <= two.makespan


def test_small_n_case_where_the_split_is_shorter():
  """Found by the fuzz: the templates/completion give 53 and 66 steps at
  N = 4 and 5; 2 + 2 and 2 + 3 concatenated give 52 and 65."""
  graph = BlockGraph.from_dict({
      "name": "fuzz54", "num_devices": 2,
      "blocks": [{"id": 0, "kind": "F", "span": 3, "memory": 1,
                  "devices": [0, 1]},
                 {"id": 1, "kind": "F", "span": 4, "memory": 3,
                  "devices": [1]},
                 {"id": 2, "kind": "B", "span": 5, "memory": -1,
                  "devices": [0, 1]},
                 {"id": 3, "kind": "B", "span": 1, "memory": -3,
                  "devices": [1]}],
      "edges": [[0, 1], [1, 3], [3, 2]], "edge_delays": [0, 0, 1]})
  sched = search_repetend(graph, 6, time_limit_s=0.3)
  for n in range(2, 6):
    run = sched.unroll(n)
    validate.assert_valid(run)
    assert fuzz_lib.independent_check(graph, n, 6, fuzz_lib.triples(run)) == []
    for a in range(1, n):
      assert run.makespan <= (sched.unroll(a).makespan
                              + sched.unroll(n - a).makespan)
