"""The fast-column runner's case loop (``experiments.search_cases_fast``)."""

import random

from experiments import search_cases_fast_lib
from tessel_jax.search import period_search


def test_a_given_limit_runs_every_variant_profiled_and_restores_the_search():
  before = period_search.CONSTRUCT_TRIES, period_search.CONSTRUCT_FIRST
  cache = search_cases_fast_lib._given_limits(["vshape:2:40"])  # pylint: disable=protected-access
  row = search_cases_fast_lib.run_case(
      "vshape", 2, n=8, rounds=1, time_limit=2.0, rng=random.Random(0),
      cache=cache, profile=True, compare=True)
  variants = ("scratch", "scratch_noconstruct", "scratch_first",
              "scratch_after")
  for variant in variants:
    (record,) = row[variant]
    assert record["makespan"] > 0 and record["period"] >= 1
    assert "solves" in record  # the --profile record
  assert "start" not in row  # no witness for a given limit
  assert (period_search.CONSTRUCT_TRIES,
          period_search.CONSTRUCT_FIRST) == before
