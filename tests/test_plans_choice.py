"""How placement="auto" chooses fast: the lower bound that prunes plans
before their search, screening then full builds, the per-process memo."""

from __future__ import annotations

import dataclasses
import types

import jax
import pytest

import tessel_jax as tj
from tessel_jax import placements as _placements
from tessel_jax import plans as P

import test_lowering_models as M

KINDS = ["embed", "mixed", "layer", "head"]


def _costs(work, shared=None, graph=None):
  graph = graph or _placements.get("vshape", 2)
  seconds = {b.id: w for b, w in zip(graph.blocks, work)}
  return types.SimpleNamespace(
      graph=graph, work=seconds if shared else None, shared_cores=shared,
      quantized=types.SimpleNamespace(seconds=seconds))


def test_lower_bound_busiest_device_and_shared_cores():
  # vshape(2): F0 and B0 on device 0, F1 and B1 on device 1.
  c = _costs([1.0, 2.0, 4.0, 3.0])
  assert P.step_lower_bound(c, 5) == pytest.approx(5 * 6.0)   # device 1
  # Two devices on one shared core: all the work runs on that core.
  c = _costs([1.0, 2.0, 4.0, 3.0], shared=1.0)
  assert P.step_lower_bound(c, 5) == pytest.approx(5 * 10.0)
  # On 2 cores the busiest device bounds again.
  c = _costs([1.0, 2.0, 4.0, 3.0], shared=2.0)
  assert P.step_lower_bound(c, 5) == pytest.approx(5 * 6.0)


def test_a_bound_at_or_above_the_best_prunes():
  ff = P.FrontierFunction(lambda p, b: 0.0, mesh=None, prune=True)
  ff._check_bound(P.Candidate("vshape", 2, 1, 4), 99.0)   # nothing priced yet
  best = P.PricedPlan(candidate=P.Candidate("vshape", 2, 1, 4), step=10.0,
                      unit="ms", peak_bytes_per_device=(5, 5),
                      source="tessel", blocks=2, build_seconds=0.0)
  ff._note_best(best)
  ff._check_bound(P.Candidate("mshape", 2, 1, 4), 9.99)
  with pytest.raises(P.Pruned, match="lower bound 10.000 ms"):
    ff._check_bound(P.Candidate("mshape", 2, 1, 4), 10.0)
  assert ff.pruned == 1
  # Over the memory limit: not a best to beat.
  tight = P.FrontierFunction(lambda p, b: 0.0, mesh=None, prune=True,
                             memory_limit=4)
  tight._note_best(best)
  tight._check_bound(P.Candidate("mshape", 2, 1, 4), 1e9)


def test_auto_memo_second_choice_reuses_the_plans(monkeypatch):
  monkeypatch.setattr(P, "DEFAULT_PLACEMENTS", ("vshape",))
  P.clear_memo()
  params, batch = M.make_params(M.num_layers(KINDS)), M.make_batch(8)
  fn = M.chain_fn(KINDS)
  mesh = jax.make_mesh((2,), ("pipe",), devices=jax.devices()[:2])
  first = tj.schedule(fn, mesh=mesh, placement="auto", num_microbatches=4)
  first.build(params, batch)
  again = tj.schedule(fn, mesh=mesh, placement="auto", num_microbatches=4)
  built = again.build(params, batch)
  assert again.choice.winner == first.choice.winner
  assert again.choice.step is first.choice.step   # the same built plan
  assert built.plan is first.built.plan
  # Other options are other plans.
  other = tj.schedule(fn, mesh=mesh, placement="auto", num_microbatches=4,
                      seed=1)
  other.build(params, batch)
  assert other.choice.step is not first.choice.step


def test_a_plan_that_cannot_be_built_fails_once_per_process(monkeypatch):
  P.clear_memo()
  params, batch = M.make_params(M.num_layers(KINDS)), M.make_batch(8)
  mesh = jax.make_mesh((2,), ("pipe",), devices=jax.devices()[:2])
  ff = P.FrontierFunction(M.chain_fn(KINDS), mesh=mesh, refine=1)
  ff._key = ff.program_key(params, batch)
  calls = []

  def broken(self, *a, **k):
    calls.append(1)
    raise ValueError("no such plan")
  from tessel_jax import api  # pylint: disable=import-outside-toplevel
  monkeypatch.setattr(api.ScheduledFunction, "build", broken)
  c = P.Candidate("vshape", 2, 1, 4)
  for _ in range(2):
    with pytest.raises(ValueError, match="no such plan"):
      ff.price(c, params, batch, screen=True)
  assert len(calls) == 1


def test_a_classic_winner_is_built_once_per_process(monkeypatch):
  monkeypatch.setattr(P, "DEFAULT_PLACEMENTS", ("vshape",))
  P.clear_memo()
  real = P.FrontierFunction.price_baseline

  def faster(self, c, base):   # make the classic schedules win
    import dataclasses  # pylint: disable=import-outside-toplevel
    p = real(self, c, base)
    return dataclasses.replace(p, step=p.step / 10)
  monkeypatch.setattr(P.FrontierFunction, "price_baseline", faster)
  params, batch = M.make_params(M.num_layers(KINDS)), M.make_batch(8)
  fn = M.chain_fn(KINDS)
  mesh = jax.make_mesh((2,), ("pipe",), devices=jax.devices()[:2])
  first = tj.schedule(fn, mesh=mesh, placement="auto", num_microbatches=4)
  built = first.build(params, batch)
  assert first.choice.winner.candidate.plan is not None
  assert built.unrolled.source == first.choice.winner.candidate.plan
  again = tj.schedule(fn, mesh=mesh, placement="auto", num_microbatches=4)
  again.build(params, batch)
  assert again.choice.step is first.choice.step


def test_refine_builds_the_fastest_screened_plans_in_full(monkeypatch):
  def plan(name, step, peak, how=None, screened=True):
    return P.PricedPlan(candidate=P.Candidate(name, 2, 1, 4, how), step=step,
                        unit="ms", peak_bytes_per_device=(peak,),
                        source=how or "tessel", blocks=2, build_seconds=0.0,
                        screened=screened)
  ff = P.FrontierFunction(lambda p, b: 0.0, mesh=None, refine=1,
                          memory_limit=100)
  built = []

  def price(self, c, params, batch, markers=None, screen=False):
    built.append((c.placement, screen))
    return plan(c.placement, {"a": 5.0, "b": 20.0, "c": 1.0}[c.placement],
                50, screened=False)
  monkeypatch.setattr(P.FrontierFunction, "price", price)
  monkeypatch.setattr(P.FrontierFunction, "price_baseline",
                      lambda self, c, base: dataclasses.replace(
                          base, candidate=c, step=base.step + 1))
  priced = [plan("a", 10.0, 50), plan("a", 9.0, 50, "1f1b"),
            plan("b", 12.0, 50), plan("c", 2.0, 500)]   # c does not fit
  ff._refine(priced, None, None, None)
  # "a" (fastest fitting screened, through its 1f1b baseline) built in
  # full; then the fastest fitting plan is a full build: stop.
  assert built == [("a", False)]
  # The plans left screened are put on the full builds' scale (a: 10
  # screened, 5 in full): b 12 -> 6, c 2 -> 1.
  assert [p.step for p in priced] == [5.0, 6.0, 6.0, 1.0]
  assert not priced[0].screened and priced[2].screened


def test_fastest_check_reads_screened_prices_on_the_full_scale(
    monkeypatch):
  """a (screened 4) is 8 in full; b screened at 5 is 10 on the full
  scale, so the fastest fitting plan is a full build and b is not built
  (before: b's raw 5 < 8 read as the fastest plan, built though it cannot
  win)."""
  ff = P.FrontierFunction(lambda p, b: 0.0, mesh=None, refine=1,
                          refine_margin=0.0)
  built = []

  def price(self, c, params, batch, markers=None, screen=False):
    built.append(c.placement)
    return P.PricedPlan(candidate=c, step={"a": 8.0, "b": 10.0}[c.placement],
                        unit="ms", peak_bytes_per_device=(50,),
                        source="tessel", blocks=2, build_seconds=0.0)
  monkeypatch.setattr(P.FrontierFunction, "price", price)
  priced = [P.PricedPlan(candidate=P.Candidate(n, 2, 1, 4), step=s,
                         unit="ms", peak_bytes_per_device=(50,),
                         source="tessel", blocks=2, build_seconds=0.0,
                         screened=True)
            for n, s in (("a", 4.0), ("b", 5.0))]
  ff._refine(priced, None, None, None)
  assert built == ["a"]
  assert [p.step for p in priced] == pytest.approx([8.0, 10.0])


def test_refine_margin_compares_screened_prices_on_the_full_scale(
    monkeypatch):
  """Full builds (cost="calibrated": stand-in timed) price 2.5x below the
  screened ones here; a screened plan is compared with the fastest full
  build only after that factor, so "b" is built in full and wins (before:
  12 >= 1.25 x 4, never built)."""
  full = {"a": 4.0, "b": 3.5}
  ff = P.FrontierFunction(lambda p, b: 0.0, mesh=None, refine=1,
                          refine_margin=0.25)
  built = []

  def price(self, c, params, batch, markers=None, screen=False):
    built.append(c.placement)
    return P.PricedPlan(candidate=c, step=full[c.placement], unit="ms",
                        peak_bytes_per_device=(50,), source="tessel",
                        blocks=2, build_seconds=0.0)
  monkeypatch.setattr(P.FrontierFunction, "price", price)
  priced = [P.PricedPlan(candidate=P.Candidate(n, 2, 1, 4), step=s,
                         unit="ms", peak_bytes_per_device=(50,),
                         source="tessel", blocks=2, build_seconds=0.0,
                         screened=True)
            for n, s in (("a", 10.0), ("b", 12.0), ("c", 40.0))]
  ff._refine(priced, None, None, None)
  assert built == ["a", "b"]
  # c stays screened, reported on the full scale (median of 0.4, 0.29).
  assert [p.step for p in priced] == pytest.approx(
      [4.0, 3.5, 40.0 * (0.4 + 3.5 / 12) / 2])
  assert P.full_scale([(10.0, 4.0)]) == pytest.approx(0.4)
  assert P.full_scale([]) == 1.0
