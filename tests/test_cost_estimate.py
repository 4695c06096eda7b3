"""Kernel estimates from XLA's cost analysis (``cost.estimate``) and the
cheap screening of ``placement="auto"`` built on them (``plans``)."""

from __future__ import annotations

import glob
import json
import types

import jax
import jax.numpy as jnp
import pytest

from tessel_jax import plans as P
from tessel_jax.cost import estimate as E
from tessel_jax.cost import flops as F

import test_lowering_models as M


# Builds here price ticks with the microbenchmark's figures, not test them:
# measured once per worker and mesh (conftest.shared_tick_costs).
pytestmark = pytest.mark.usefixtures("shared_tick_costs")

KINDS = ["embed", "layer", "layer", "head"]


def test_flops_of_a_matmul_come_from_xla():
  low = jax.jit(lambda a, b: a @ b).lower(jnp.ones((8, 16)), jnp.ones((16, 4)))
  assert F.analysed_flops(low) == pytest.approx(2 * 8 * 16 * 4)


def _rec(label, flops, seconds, **kw):
  return {"label": label, "flops": flops, "seconds": seconds, **kw}


def test_rates_per_kind_need_enough_measured_kernels():
  est = E.KernelEstimator(flops_of=lambda k, avals: 1000.0)
  kernel = types.SimpleNamespace(kind="B", label="B2")
  few = [_rec("F0", 100, 1.0), _rec("B0", 100, 3.0), _rec("F1", 100, 1.0)]
  assert not est.ready(few)
  assert est.estimate(kernel, [], few) is None
  # Estimates and records without flops never calibrate.
  ignored = [_rec("B9", 1, 99.0, estimated=True), {"label": "B8",
                                                   "seconds": 9.0}]
  assert est.estimate(kernel, [], few + ignored) is None
  recs = few + [_rec("B1", 100, 5.0)]
  assert est.ready(recs)
  out = est.estimate(kernel, [], recs, key="k")
  # B's own rate: median of 0.03 and 0.05 s/flop.
  assert out["seconds"] == pytest.approx(1000 * 0.04)
  assert out["estimated"] and out["temp_bytes"] == 0
  # A kind with fewer than 2 measured kernels uses every kind's median.
  w = est.estimate(types.SimpleNamespace(kind="W", label="W0"), [], recs)
  assert w["seconds"] == pytest.approx(1000 * 0.02)
  assert est.estimated == 2


def test_cheap_screening_measures_only_the_plans_it_refines(tmp_path,
                                                            monkeypatch):
  monkeypatch.setattr(P, "DEFAULT_PLACEMENTS", ("vshape", "interleaved"))
  P.clear_memo()
  params, batch = M.make_params(M.num_layers(KINDS)), M.make_batch(16)
  mesh = jax.make_mesh((4,), ("pipe",), devices=jax.devices()[:4])
  cache = str(tmp_path / "cache")
  ff = P.FrontierFunction(M.chain_fn(KINDS), mesh=mesh, refine=1,
                          microbatches=[8], baselines=False, prune=True,
                          screen_time_limit_s=0.5, screen_estimate=True,
                          cost="measured", cache_dir=cache,
                          solver_time_limit_s=2.0)
  fr = ff(params, batch)
  assert ff.estimator.estimated > 0          # some kernels never compiled
  best = fr.choose()
  assert best is not None and not best.screened    # the winner: full build
  assert any(p.screened for p in fr.plans)         # the rest: screened
  step = ff.steps[best.candidate]
  assert step.solver_time_limit_s == 2.0           # the caller's budget
  assert step.built.profile.estimated == 0         # every kernel measured
  # Only full builds calibrate the tick model on a compiled stand-in.
  full = sum(not p.screened for p in fr.plans)
  assert len(ff.costs._standin) <= 2 * full  # pylint: disable=protected-access
  # Estimates are not stored: every record on disk was measured.
  records = [json.load(open(f)) for f in glob.glob(f"{cache}/kernel-*.json")]
  assert records and not any(r.get("estimated") for r in records)
  # Measured kernels keep their flops to calibrate the estimates (a kernel
  # without flops, e.g. a gather only, is always measured).
  assert sum(r.get("flops", 0) > 0 for r in records) >= E.MIN_SAMPLES


def test_autocut_group_timings_survive_the_process(tmp_path, monkeypatch):
  from tessel_jax.cost import cache as C  # pylint: disable=import-outside-toplevel
  from tessel_jax.passes import autocut, autocut_cost  # pylint: disable=import-outside-toplevel
  from tessel_jax.passes import tracing  # pylint: disable=import-outside-toplevel
  params, batch = M.make_params(M.num_layers(KINDS)), M.make_batch(4)
  traced = tracing.trace(M.chain_fn(KINDS), "f", params, batch)
  flat = autocut.flatten(traced)
  cache = C.ProfileCache(str(tmp_path))
  monkeypatch.setattr(autocut_cost, "_GROUP_CACHE", {})
  first = autocut_cost.measured_costs(flat, train=True, num_groups=4,
                                      repeats=2, min_seconds=0.0, cache=cache)
  assert first.timed > 0
  assert len(glob.glob(str(tmp_path / "group-*.json"))) == first.timed
  # A new process (empty in-process cache) reads them back: nothing timed,
  # the same per-equation costs, so the same cut.
  monkeypatch.setattr(autocut_cost, "_GROUP_CACHE", {})
  again = autocut_cost.measured_costs(flat, train=True, num_groups=4,
                                      cache=C.ProfileCache(str(tmp_path)))
  assert again.timed == 0
  assert list(again.seconds) == pytest.approx(list(first.seconds))
  # reprofile=True ignores them.
  monkeypatch.setattr(autocut_cost, "_GROUP_CACHE", {})
  fresh = autocut_cost.measured_costs(
      flat, train=True, num_groups=4, repeats=2, min_seconds=0.0,
      cache=C.ProfileCache(str(tmp_path), reprofile=True))
  assert fresh.timed == first.timed


def _plan(name, step, peak=50, screened=True):
  return P.PricedPlan(candidate=P.Candidate(name, 2, 1, 4), step=step,
                      unit="ms", peak_bytes_per_device=(peak,),
                      source="tessel", blocks=2, build_seconds=0.0,
                      screened=screened)


@pytest.mark.parametrize("margin,want", [(0.0, ["a"]), (0.25, ["a", "b"]),
                                         (0.5, ["a", "b", "c"])])
def test_refine_margin_builds_the_close_screened_plans(monkeypatch, margin,
                                                       want):
  ff = P.FrontierFunction(lambda p, b: 0.0, mesh=None, refine=1,
                          memory_limit=100, refine_margin=margin)
  built = []
  full = {"a": 10.0, "b": 11.0, "c": 30.0}

  def price(self, c, params, batch, markers=None, screen=False):
    built.append(c.placement)
    return _plan(c.placement, full[c.placement], screened=False)
  monkeypatch.setattr(P.FrontierFunction, "price", price)
  # Screened: a 8 (full 10: screened prices scale by 1.25), b 9.6 and
  # c 11.2, so b at 12 is within 25% of a's full 10, c at 14 within 50%.
  priced = [_plan("a", 8.0), _plan("b", 9.6), _plan("c", 11.2),
            _plan("d", 1.0, peak=500)]   # d does not fit
  ff._refine(priced, None, None, None)
  assert built == want
  assert min((p for p in priced if p.peak_bytes <= 100),
             key=lambda p: p.step).label.startswith("a ")


def test_refine_drops_a_plan_its_bound_prunes(monkeypatch):
  ff = P.FrontierFunction(lambda p, b: 0.0, mesh=None, refine=2)

  def price(self, c, params, batch, markers=None, screen=False):
    if c.placement == "b":
      raise P.Pruned("lower bound 12.000 ms >= 10.000 ms")
    return _plan(c.placement, 10.0, screened=False)
  monkeypatch.setattr(P.FrontierFunction, "price", price)
  priced = [_plan("a", 9.0), _plan("b", 8.0)]
  skipped = []
  ff._refine(priced, None, None, None, skipped)
  assert [p.label for p in priced] == ["a pipe2 dp1 N4 searched"]
  assert skipped and skipped[0][1].startswith("Pruned: lower bound")
