"""The constructive modulo scheduler (``modulo_construct``) and the period
search's use of it: valid repetends, never over the limit, checked by the
independent validator on the plain modulo schedule."""

from __future__ import annotations

import hypothesis
from hypothesis import strategies as st

from tessel_jax import placements, validate
from tessel_jax.schedule import (Repetend, Schedule, UnrolledSchedule,
                                 modulo_actions)
from tessel_jax.search import (modulo_model, period_search, prober,
                               search_repetend)
from tessel_jax.search.modulo_construct import construct_repetend
from tessel_jax.search.period_bounds import period_lower_bound

from test_search import random_placements


def _violations(graph, period, sol, limit, allow_wrap):
  """Every violation of the plain modulo schedule of ``sol`` over enough
  micro-batches to reach its steady state (``validate.check``), and
  blocks wrapping around the period end where that is not allowed."""
  rep = Repetend(period, sol.offsets, sol.phases)
  n = rep.max_offset + 3
  actions = sorted(modulo_actions(Schedule(graph, rep, limit), n))
  unrolled = UnrolledSchedule(graph, n, tuple(actions), memory_limit=limit)
  found = [str(v) for v in validate.check(unrolled)]
  if not allow_wrap:
    found += [f"block {b.id} wraps" for b, r in zip(graph.blocks, sol.phases)
              if r + b.span > period]
  return found


@hypothesis.settings(max_examples=60, deadline=None)
@hypothesis.given(random_placements(), st.integers(0, 3))
def test_constructed_repetends_are_valid_and_under_the_limit(case, extra):
  graph, limit, wrap = case
  period = period_lower_bound(graph) + extra
  sol = construct_repetend(graph, period, limit, allow_wrap=wrap, tries=8)
  hypothesis.assume(sol is not None)
  assert sol.status == "FEASIBLE"
  assert not _violations(graph, period, sol, limit, wrap)


def test_nnshape_at_its_fast_limits_is_built_at_the_busiest_load():
  # The fast column's limits (BENCHMARKS, plan8/plan9): CP-SAT needed 4-14
  # CPU s to find these periods (nnshape d4 found nothing in 20 det s
  # without a hint).
  for name, devices, limit, period in [("nnshape", 4, 13, 16),
                                       ("nnshape_eager", 4, 10, 18)]:
    graph = placements.get(name, devices, mode="train")
    for wrap in (True, False) if name == "nnshape_eager" else (True,):
      sol = construct_repetend(graph, period, limit, allow_wrap=wrap)
      assert sol is not None, (name, wrap)
      assert not _violations(graph, period, sol, limit, wrap)


def test_a_limit_below_the_least_peak_builds_nothing():
  graph = placements.get("nnshape", 4, mode="train")
  # Every device holds its first forward's memory at least once.
  assert construct_repetend(graph, 16, 0, tries=4) is None


def _period_solves(monkeypatch):
  """Records the ``objective`` of every modulo solve of the search."""
  calls = []
  real = modulo_model.solve_modulo

  def spy(*args, **kw):
    calls.append(kw.get("objective"))
    return real(*args, **kw)

  monkeypatch.setattr(period_search, "solve_modulo", spy)
  monkeypatch.setattr(prober, "solve_modulo", spy)
  return calls


def _nnshape4_constructed(monkeypatch, first: bool):
  """``(period solves' limits, schedule)``: nnshape, 4 devices, limit 13,
  searched with the constructive scheduler on (``first``: before the first
  solve, else once it decided nothing)."""
  calls = _period_solves(monkeypatch)
  monkeypatch.setattr(period_search, "CONSTRUCT_TRIES", 64)
  monkeypatch.setattr(period_search, "CONSTRUCT_FIRST", first)
  graph = placements.get("nnshape", 4, mode="train")
  return calls, search_repetend(graph, 13, complete=False,
                                list_alternative=False, time_limit_s=8)


def test_an_undecided_first_probe_is_followed_by_a_built_repetend(
    monkeypatch):
  # nnshape, 4 devices, limit 13: the first probe (1/16 of the budget)
  # decides nothing; the built repetend then ends the period search, with
  # no second probe (before it: one more solve with no limit, and two more
  # probes).
  calls, schedule = _nnshape4_constructed(monkeypatch, first=False)
  assert schedule.period == 16 and schedule.status == "OPTIMAL"
  assert calls[0] is None and set(calls[1:]) == {"latency"}


def test_built_first_the_search_makes_no_period_solve(monkeypatch):
  calls, schedule = _nnshape4_constructed(monkeypatch, first=True)
  assert schedule.period == 16 and schedule.status == "OPTIMAL"
  assert set(calls) == {"latency"}  # the polish's, none to find the period
  # No CP-SAT work before the polish: its CPU rate is not read from the
  # bounds' seconds (which made it skip the ramps as if at the cap).
  assert not schedule.cut_by_clock


def test_an_unknown_construct_mode_warns_with_the_fix():
  """``TESSEL_JAX_CONSTRUCT`` set to a value the search does not know is
  not silently read as off: a warning names the values that turn it on."""
  import os
  import subprocess
  import sys
  env = dict(os.environ, TESSEL_JAX_CONSTRUCT="1")
  proc = subprocess.run(
      [sys.executable, "-c", "import tessel_jax.search.period_search as p;"
       " print(p.CONSTRUCT_TRIES)"], env=env, capture_output=True,
      text=True, check=True, timeout=120)
  assert proc.stdout.strip() == "0"
  assert "TESSEL_JAX_CONSTRUCT='1'" in proc.stderr
  assert "TESSEL_JAX_CONSTRUCT=first" in proc.stderr


def _built_first(monkeypatch) -> None:
  monkeypatch.setattr(period_search, "CONSTRUCT_TRIES", 64)
  monkeypatch.setattr(period_search, "CONSTRUCT_FIRST", True)


def test_built_first_nnshape4_is_not_longer_than_the_cpsat_search(
    monkeypatch):
  # Session 39: the CP-SAT search unrolled 2068 steps at N = 128, the built
  # repetend 2069 (its best cut's ramps stopped at 0.05 s; once more with
  # 0.2 s they reach 2067, ``ramps.refined``).
  _built_first(monkeypatch)
  graph = placements.get("nnshape", 4, mode="train")
  schedule = search_repetend(graph, 13, time_limit_s=30,
                             list_alternative=False)
  assert schedule.period == 16 and schedule.status == "OPTIMAL"
  unrolled = schedule.unroll(128)
  validate.assert_valid(unrolled, memory_limit=13)
  assert unrolled.makespan <= 2068


def test_built_first_tessel_nnshape7_limit20_meets_the_bound(monkeypatch):
  # Tessel's held-out case (simu_fast_scale): the CP-SAT search meets the
  # bound, 1048 at N = 128; the built repetend polished for latency
  # unrolled 1049, the built one itself 1048 (compose.finished).
  from experiments import tessel_cases
  from tessel_jax import simulate
  _built_first(monkeypatch)
  graph = tessel_cases.get("nnshape", 7, True)
  schedule = search_repetend(graph, 20, time_limit_s=10,
                             list_alternative=False)
  unrolled = schedule.unroll(128)
  validate.assert_valid(unrolled, memory_limit=20)
  assert unrolled.makespan <= simulate.lower_bound_makespan_shared(graph, 128)


@hypothesis.settings(max_examples=40, deadline=None)
@hypothesis.given(random_placements(), st.integers(0, 3),
                  st.randoms(use_true_random=False))
def test_the_builders_evaluator_matches_the_reference_one(case, extra, rnd):
  """``_Shape``'s offsets and peaks are ``earliest_offsets``' and
  ``steady_peak``'s on any phases (the descents rank repetends by them)."""
  from tessel_jax.search import modulo_construct as mc
  from tessel_jax.search.modulo_solution import (earliest_offsets,
                                                 steady_peak)
  graph, limit, _ = case
  period = period_lower_bound(graph) + extra
  phases = tuple(rnd.randrange(period) for _ in graph.blocks)
  shape = mc._shape(graph)
  offsets = earliest_offsets(graph, period, phases)
  assert tuple(mc._earliest(shape, period, phases)) == offsets
  peaks = [mc._device_peak(on_d, phases, offsets) for on_d in shape.held]
  assert max(peaks, default=0) == steady_peak(graph, period, phases, offsets)
  over, latency, total = mc._excess(shape, period, phases, limit)
  assert total == sum(peaks)
  assert over == sum(max(0, p - (limit or 0)) for p in peaks)
  assert latency == Repetend(period, offsets, phases).latency(
      [b.span for b in graph.blocks])


def test_a_built_repetend_gets_one_ramps_pass_and_one_refine(monkeypatch):
  # nnshape, 4 devices, limit 13: the built repetend and, where the polish
  # shortens its latency, the polished one are both candidates; only the
  # winner's best cut is refined (fastcol2 refined each: 26 compactions),
  # and the latency rounds get a quick search's budget, not a start's
  # sixteenth of the whole (0.23 deterministic s a round before).
  from tessel_jax.search import compose, completion, ramps
  _built_first(monkeypatch)
  refines, polishes = [], []
  real_refined, real_polished = ramps.refined, compose.polished
  monkeypatch.setattr(ramps, "refined", lambda *a, **k: refines.append(1)
                      or real_refined(*a, **k))
  monkeypatch.setattr(compose, "polished", lambda solve, found, polish, **k:
                      polishes.append(polish)
                      or real_polished(solve, found, polish, **k))
  compactions = []
  real_compact = completion.compact_templates
  monkeypatch.setattr(completion, "compact_templates", lambda *a, **k:
                      compactions.append(k.get("solve", True))
                      or real_compact(*a, **k))
  graph = placements.get("nnshape", 4, mode="train")
  schedule = search_repetend(graph, 13, time_limit_s=30,
                             list_alternative=False)
  assert schedule.period == 16 and schedule.status == "OPTIMAL"
  assert len(refines) <= 1
  assert polishes == [0.005 * graph.num_blocks]
  cuts = len(ramps.cut_points(schedule.repetend))
  assert len(compactions) <= 2 * cuts  # at most two candidates, no refines
