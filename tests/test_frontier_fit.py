"""placement="auto" never returns a plan over the memory limit: a plan that
fits by its (screened) price but not once built in full gives way to the
next fitting plan (``tessel_jax.frontier_fit``)."""

from __future__ import annotations

import dataclasses
import re

import jax
import pytest

import tessel_jax as tj
from tessel_jax import plans as P

import test_lowering_models as M

KINDS = ["embed", "mixed", "layer", "head"]


def _setup(monkeypatch, fake):
  """vshape(2), N = 4, uniform costs; ``fake(plan)`` rewrites each priced
  plan (a screened price that leaves out what the full build needs)."""
  monkeypatch.setattr(P, "DEFAULT_PLACEMENTS", ("vshape",))
  real = P.FrontierFunction._price_frontier

  def priced(self, *args):
    fr = real(self, *args)
    plans = [fake(p) for p in fr.plans]
    return dataclasses.replace(fr, plans=tuple(plans),
                               pareto=P.pareto(plans))
  monkeypatch.setattr(P.FrontierFunction, "_price_frontier", priced)
  P.clear_memo()
  mesh = jax.make_mesh((2,), ("pipe",), devices=jax.devices()[:2])
  params, batch = M.make_params(M.num_layers(KINDS)), M.make_batch(8)
  return M.chain_fn(KINDS), mesh, params, batch


def _gpipe_looks(step, peak):
  def fake(p):
    if p.candidate.plan != "gpipe":
      return p
    return dataclasses.replace(p, step=step, screened=True,
                               peak_bytes_per_device=(peak, peak))
  return fake


def _limit(fn, mesh, params, batch):
  """The searched plan's peak (a limit GPipe's full build is over)."""
  fr = tj.frontier(fn, mesh=mesh, placements=("vshape",),
                   microbatches=[4])(params, batch)
  searched = next(p for p in fr.plans if p.candidate.plan is None)
  gpipe = next(p for p in fr.plans if p.candidate.plan == "gpipe")
  assert gpipe.peak_bytes > searched.peak_bytes   # what the test needs
  return searched.peak_bytes, gpipe.peak_bytes


def test_a_plan_over_the_limit_in_full_gives_way_to_the_next(monkeypatch):
  fn, mesh, params, batch = _setup(monkeypatch, lambda p: p)
  limit, gpipe_peak = _limit(fn, mesh, params, batch)
  # GPipe priced fastest at a peak under the limit: its full build is not.
  _setup(monkeypatch, _gpipe_looks(1.0, limit - 8))
  step = tj.schedule(fn, mesh=mesh, placement="auto", num_microbatches=4,
                     memory_limit=limit)
  loss, grads = step(params, batch)
  assert max(step.report.peak_memory_bytes) <= limit
  assert step.choice.winner.candidate.plan != "gpipe"
  assert step.choice.winner.peak_bytes <= limit
  # The frontier shows GPipe at its full peak.
  shown = next(p for p in step.choice.frontier.plans
               if p.candidate.plan == "gpipe")
  assert shown.peak_bytes == gpipe_peak
  ref_loss, ref_grads = M.reference(fn, params, batch, 4)
  assert M.max_rel_err(loss, ref_loss) <= 1e-5
  assert M.max_rel_err(grads, ref_grads) <= 1e-5


def test_a_plan_whose_full_build_finds_no_schedule_is_dropped(monkeypatch):
  fn, mesh, params, batch = _setup(monkeypatch, lambda p: p)
  limit, _ = _limit(fn, mesh, params, batch)
  tight = P.Candidate("vshape", 2, 1, 4, memory_limit=64)

  def fake(p):   # a search under 64 bytes, priced fastest by screening
    if p.candidate.plan is not None or p.candidate.memory_limit is not None:
      return p
    return dataclasses.replace(p, candidate=tight, step=1.0, screened=True,
                               peak_bytes_per_device=(64, 64))
  _setup(monkeypatch, fake)
  step = tj.schedule(fn, mesh=mesh, placement="auto", num_microbatches=4,
                     memory_limit=limit)
  step.build(params, batch)
  assert max(step.report.peak_memory_bytes) <= limit
  assert step.choice.winner.candidate != tight
  fr = step.choice.frontier
  assert tight not in {p.candidate for p in fr.plans}
  assert any(what == tight.label and "no schedule fits" in why
             for what, why in fr.skipped)


def test_the_smallest_limit_named_is_a_full_builds_peak(monkeypatch):
  fn, mesh, params, batch = _setup(monkeypatch, lambda p: p)
  limit, _ = _limit(fn, mesh, params, batch)
  # GPipe priced at the smallest peak of all, which its full build is not.
  _setup(monkeypatch, _gpipe_looks(99.0, limit // 2))
  with pytest.raises(tj.TesselError, match="smallest peak is") as info:
    tj.schedule(fn, mesh=mesh, placement="auto", num_microbatches=4,
                memory_limit=limit // 4).build(params, batch)
  named = int(re.search(r"smallest peak is (\d+)", str(info.value))[1])
  assert named == limit
  step = tj.schedule(fn, mesh=mesh, placement="auto", num_microbatches=4,
                     memory_limit=named)
  step.build(params, batch)
  assert max(step.report.peak_memory_bytes) <= named
