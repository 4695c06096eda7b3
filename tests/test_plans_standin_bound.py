"""placement="auto" under ``cost="calibrated"``: a plan whose prediction
without its stand-in program already reaches the fastest fitting plan
priced so far is priced by that lower bound, its stand-in not compiled
and timed (``CostModel.standin_bounds``, ``PricedPlan.bound``). The
stand-in timer is replaced by a fixed figure (no timing in tests)."""

from __future__ import annotations

import dataclasses

import jax
import pytest

import tessel_jax as tj
from tessel_jax import placements
from tessel_jax import frontier_memo as FM
from tessel_jax import plans as P
from tessel_jax.cost import calibrate

from test_cost import _tiny


# Builds here price ticks with the microbenchmark's figures, not test them:
# measured once per worker and mesh (conftest.shared_tick_costs).
pytestmark = pytest.mark.usefixtures("shared_tick_costs")


def _build(tmp_path, monkeypatch, ceiling_s):
  calls = []

  def fake_timer(make_program, params, batch, repeats=7):
    del make_program, params, batch, repeats

    def run(plan):
      calls.append(plan)
      return 0.25
    return run

  monkeypatch.setattr(calibrate, "program_timer", fake_timer)
  fn, params, batch = _tiny(n=4, kinds=("embed", "head"))
  step = tj.schedule(fn, mesh=jax.make_mesh((2,), ("pipe",)),
                     placement=placements.vshape(2), num_microbatches=4,
                     cost="calibrated", cache_dir=str(tmp_path))
  step._costs.standin_ceiling_s = ceiling_s  # pylint: disable=protected-access
  step.build(params, batch)
  return step, calls


def test_a_plan_bounded_above_the_ceiling_times_no_standin(tmp_path,
                                                           monkeypatch):
  low, calls = _build(tmp_path / "a", monkeypatch, 1e-9)
  assert not calls and low._costs.bound_last  # pylint: disable=protected-access
  assert low._costs.standins_skipped >= 1  # pylint: disable=protected-access
  bound_ms = low.report.predicted_step_ms
  # The same plan with no ceiling: both candidates' stand-ins timed, and
  # the calibrated price (a 250 ms stand-in) is above the bound.
  full, calls = _build(tmp_path / "b", monkeypatch, None)
  assert calls and not full._costs.bound_last  # pylint: disable=protected-access
  assert full.report.predicted_step_ms >= 250.0 > bound_ms
  # A stand-in already on disk is used whatever the ceiling: no bound.
  again, calls = _build(tmp_path / "b", monkeypatch, 1e-9)
  assert not calls and not again._costs.bound_last  # pylint: disable=protected-access
  assert again.report.predicted_step_ms == pytest.approx(
      full.report.predicted_step_ms, rel=0.2)


def _plan(name, step, bound=False, how=None):
  return P.PricedPlan(candidate=P.Candidate(name, 2, 1, 4, how), step=step,
                      unit="ms", peak_bytes_per_device=(50,),
                      source=how or "tessel", blocks=2, build_seconds=0.0,
                      bound=bound)


def test_a_classic_schedule_scaled_below_the_best_from_a_bound_is_repriced(
    monkeypatch):
  ff = P.FrontierFunction(lambda p, b: 0.0, mesh=None, prune=True)
  ff._note_best(_plan("a", 10.0))
  full = []

  def price(self, c, params, batch, markers=None, screen=False,
            ceiling=True):
    full.append((c.placement, ceiling))
    return _plan(c.placement, 14.0)
  monkeypatch.setattr(P.FrontierFunction, "price", price)
  # Replay ratio 0.8: the bound base 12 gives 9.6 < 10 (could win).
  monkeypatch.setattr(P.FrontierFunction, "price_baseline",
                      lambda self, c, base: dataclasses.replace(
                          base, candidate=c, step=0.8 * base.step))
  one = P.Candidate("b", 2, 1, 4, "1f1b")
  got = ff._baseline(one, _plan("b", 12.0, bound=True), None, None, None)
  assert full == [("b", False)]           # the base priced in full first
  assert got.step == pytest.approx(11.2) and not got.bound
  # Scaled to 10.4 >= 10: it cannot win, the bound stands.
  full.clear()
  got = ff._baseline(one, _plan("b", 13.0, bound=True), None, None, None)
  assert not full and got.bound and got.step == pytest.approx(10.4)


def test_bound_prices_survive_the_frontier_record():
  p = _plan("a", 12.0, bound=True)
  assert P.PricedPlan.from_dict(p.to_dict()) == p
  old = p.to_dict()
  del old["bound"]   # a record written before the field
  assert not P.PricedPlan.from_dict(old).bound


def test_a_sample_waiting_for_a_core_is_capped_by_its_cpu_time():
  # 4 fake devices on 2 cores: 30 ms of CPU allow at most 2.5 x 15 ms.
  assert calibrate.sample_seconds(0.227, 0.030, 2) == pytest.approx(0.0375)
  assert calibrate.sample_seconds(0.020, 0.030, 2) == pytest.approx(0.020)
  # No CPU device known (an accelerator): the wall time.
  assert calibrate.sample_seconds(0.227, 0.001, 0) == 0.227
  x = jax.device_put(jax.numpy.ones(4), jax.devices()[0])
  assert calibrate.cpu_cores_of([x]) == 1
  assert calibrate.cpu_cores_of([1.0]) == 0


def test_a_bound_price_in_the_memo_is_priced_again_where_it_could_win(
    monkeypatch):
  ff = P.FrontierFunction(lambda p, b: 0.0, mesh=None, prune=True)
  ff._key = ("program",)
  c = P.Candidate("b", 2, 1, 4)
  P.clear_memo()
  FM.remember(FM.plan_key(ff._key, c, False), _plan("b", 12.0, bound=True),
              "step")

  class Rebuilt(Exception):
    pass

  def step_for(self, *a, **k):
    raise Rebuilt
  monkeypatch.setattr(P.FrontierFunction, "step_for", step_for)
  ff._note_best(_plan("a", 10.0))
  assert ff.price(c, None, None).step == 12.0   # cannot win: kept
  with pytest.raises(Rebuilt):
    ff.price(c, None, None, ceiling=False)      # asked for in full
  ff._note_best(_plan("a", 9.0))
  fresh = P.FrontierFunction(lambda p, b: 0.0, mesh=None, prune=True)
  fresh._key = ff._key
  fresh._note_best(_plan("a", 15.0))            # another limit: it could
  with pytest.raises(Rebuilt):
    fresh.price(c, None, None)
  P.clear_memo()
