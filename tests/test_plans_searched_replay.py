"""``plan_pricing.SearchedReplays``: the searched plan's own replay is
computed once per build however many classic schedules are priced on it,
and the prices are those computed without it. Fake replays: no jax."""

from __future__ import annotations

import gc
import types

import pytest

from tessel_jax import placements
from tessel_jax import plan_pricing as PP
from tessel_jax.frontier_result import Candidate, PricedPlan
from tessel_jax.search import baselines


class _Built(types.SimpleNamespace):
  """A build's fields the pricing reads (weakly referenceable and, like
  ``Built`` with ``eq=False``, hashed and compared by identity)."""

  __eq__ = object.__eq__
  __hash__ = object.__hash__


def _build(graph, n):
  searched = baselines.run("1f1b", graph, n)
  return _Built(
      graph=graph, unrolled=searched, plan="searched-plan", memory_unit=1,
      report=types.SimpleNamespace(fsdp_collective_ms=1.0, outside_ms=0.5))


def _replay(calls):
  def replay_run(run, plan=None):
    calls.append(plan)
    return 1e-3 * run.makespan * (0.9 if plan == "searched-plan" else 1.0)
  return replay_run


def test_classic_prices_divide_by_one_searched_replay_per_build():
  graph, n = placements.vshape(2), 4
  built = _build(graph, n)
  base = PricedPlan(candidate=Candidate("vshape", 2, 1, n), step=20.0,
                    unit="ms", peak_bytes_per_device=(100, 100),
                    source="tessel", blocks=2, build_seconds=0.0)
  plain_calls, memo_calls = [], []
  memo = PP.SearchedReplays()
  for name in ("gpipe", "1f1b"):
    c = Candidate("vshape", 2, 1, n, name)
    plain = PP.baseline_price(built, c, base, _replay(plain_calls))
    rr = _replay(memo_calls)
    kept = PP.baseline_price(built, c, base, rr, memo(built, rr))
    assert kept.step == pytest.approx(plain.step)
    assert kept.peak_bytes_per_device == plain.peak_bytes_per_device
  assert plain_calls.count("searched-plan") == 2
  assert memo_calls.count("searched-plan") == 1 and memo.computed == 1


def test_another_build_is_replayed_again():
  graph = placements.vshape(2)
  memo, calls = PP.SearchedReplays(), []
  first = _build(graph, 4)
  memo(first, _replay(calls))
  memo(first, _replay(calls))
  second = _build(graph, 8)
  assert memo(second, _replay(calls)) == pytest.approx(
      0.9e-3 * second.unrolled.makespan)
  assert memo.computed == 2
  del first
  gc.collect()   # a build gone: its id may be reused, its figure is not
  third = _build(graph, 4)
  memo(third, _replay(calls))
  assert memo.computed == 3
