"""The portfolio of alternatives to the repetend (search.portfolio)."""

import pytest

from tessel_jax import placements, simulate, validate
from tessel_jax.schedule import ScheduleError, UnrolledSchedule
from tessel_jax.search import baselines, list_schedule, portfolio
from tessel_jax.search import search_repetend


@pytest.fixture(autouse=True)
def _fresh_caches():
  portfolio.classic_figures.cache_clear()
  portfolio.cached_list_schedule.cache_clear()
  yield


def _uncached_best(graph, n, limit):
  """The shortest of the list schedule and every fitting classic one."""
  spans = []
  listed = list_schedule.best_list_schedule(graph, n, limit)
  if listed is not None:
    spans.append(portfolio.makespan(graph, listed))
  for name in baselines.for_placement(graph):
    try:
      sched = baselines.run(name, graph, n)
    except (ValueError, ScheduleError):
      continue
    if limit is None or max(sched.peak_memory) <= limit:
      spans.append(sched.makespan)
  return min(spans, default=None)


@pytest.mark.parametrize("name,limit", [
    ("vshape", None), ("vshape", 6), ("xshape", 4), ("zbv", None),
    ("zbv", 12), ("mllm", 6), ("interleaved", None)])
def test_alternative_is_the_shortest_of_list_and_classics(name, limit):
  graph = placements.get(name, 4)
  n = 16
  expected = _uncached_best(graph, n, limit)
  got = portfolio.best_alternative(graph, n, limit)
  if expected is None:
    assert got is None
    return
  assert portfolio.makespan(graph, got) == expected
  unrolled = UnrolledSchedule(graph=graph, num_microbatches=n,
                              actions=got, memory_limit=limit)
  validate.assert_valid(unrolled)
  # Told a makespan to beat: None only when nothing can be shorter.
  beaten = portfolio.best_alternative(graph, n, limit, beat=expected + 1)
  assert portfolio.makespan(graph, beaten) == expected
  bound = simulate.lower_bound_makespan_shared(graph, n)
  assert portfolio.best_alternative(graph, n, limit, beat=bound) is None


def test_nothing_runs_when_the_repetend_is_at_the_bound(monkeypatch):
  graph = placements.get("vshape", 4)
  n = 32

  def refuse(*_args, **_kw):
    raise AssertionError("an alternative ran although it cannot win")

  monkeypatch.setattr(list_schedule, "best_list_schedule", refuse)
  monkeypatch.setattr(baselines, "run", refuse)
  bound = simulate.lower_bound_makespan_shared(graph, n)
  assert portfolio.best_alternative(graph, n, None, beat=bound) is None
  schedule = search_repetend(graph, None, time_limit_s=5)
  assert schedule.unroll(n).makespan == bound  # 1F1B meets the bound


def test_classic_schedules_run_once_per_graph_and_n(monkeypatch):
  graph = placements.get("xshape", 4)
  calls = []
  run = baselines.run

  def counting(name, g, n):
    calls.append(name)
    return run(name, g, n)

  monkeypatch.setattr(baselines, "run", counting)
  first = portfolio.best_baseline(graph, 16, None)
  ran = len(calls)
  assert ran >= len(baselines.for_placement(graph)) - 1
  for limit in (3, 4, 6, 100, None):
    portfolio.best_baseline(graph, 16, limit)
  assert len(calls) <= ran + 1  # at most the winner of a new limit rebuilt
  assert portfolio.best_baseline(graph, 16, None).makespan == first.makespan
