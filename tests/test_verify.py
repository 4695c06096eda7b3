"""step.verify: the lowered program against jax.value_and_grad, and the
block that first differs when a kernel is wrong (an error is injected)."""

from __future__ import annotations

import dataclasses

import jax
import pytest

import tessel_jax as tj
from tessel_jax import verify as V
from tessel_jax.passes import kernels as K

import test_lowering_models as M

KINDS = ["embed", "mixed", "layer", "head"]


def _kinds(graph):
  n = sum(1 for b in graph.blocks if b.kind == "F")
  return ["embed", "mixed"] + ["layer"] * (n - 3) + ["head"]


def _step(graph, **kw):
  mesh = jax.make_mesh((graph.num_devices,), ("pipe",))
  return tj.schedule(M.chain_fn(_kinds(graph)), mesh=mesh, placement=graph,
                     num_microbatches=4, solver_time_limit_s=20.0, **kw)


def _inputs(graph=None):
  kinds = _kinds(graph) if graph is not None else KINDS
  return M.make_params(M.num_layers(kinds)), M.make_batch(16)


def _inject(monkeypatch, label, output=True):
  """Makes kernel ``label`` add 0.1 to its first output (or gradient)."""
  real = K.build_kernels

  def wrong(*args, **kw):
    ks = real(*args, **kw)
    kernels = dict(ks.kernels)
    for kid, k in kernels.items():
      if k.label != label:
        continue

      def fn(ctx, pvals, ivals, *, inner=k.fn):
        outs, grads = inner(ctx, pvals, ivals)
        if output:
          outs = [outs[0] + 0.1] + list(outs[1:])
        else:
          grads = [grads[0] + 0.1] + list(grads[1:])
        return outs, grads
      kernels[kid] = dataclasses.replace(k, fn=fn)
    return dataclasses.replace(ks, kernels=kernels)
  monkeypatch.setattr(K, "build_kernels", wrong)


@pytest.mark.parametrize("graph", [tj.placements.vshape(4),
                                   tj.placements.mshape(4),
                                   tj.placements.zbv(2)],
                         ids=lambda g: g.name)
def test_correct_program_passes_and_every_block_matches(graph):
  step = _step(graph)
  params, batch = _inputs(graph)
  report = step.verify(params, batch)
  assert report.ok, str(report)
  assert report.blocks == () and report.first_bad_block is None
  assert {l.path for l in report.leaves} >= {"[0]", "[1]['wte']"}
  # Every kernel alone (split, replicated, B/W split) matches the plain
  # function's intermediate values.
  n = step.num_microbatches
  mb = V._split_microbatches(batch, n)[0]
  checks = V.check_blocks(step.built, params, mb, n, 1e-5, train=True)
  assert len(checks) == len(step.built.kernels.kernels)
  assert all(c.ok for c in checks), checks
  assert "OK" in str(report)


@pytest.mark.parametrize("label,output", [("F2", True), ("B1", False)])
def test_injected_error_is_named(monkeypatch, label, output):
  _inject(monkeypatch, label, output)
  step = _step(tj.placements.vshape(4))
  params, batch = _inputs()
  report = step.verify(params, batch)
  assert not report.ok
  assert report.first_bad_block == label, str(report)
  text = str(report)
  assert f"first block that differs: {label}" in text and "<-- differs" in text


def test_infer_mode_and_smaller_microbatch_count():
  graph = tj.placements.vshape(4)
  mesh = jax.make_mesh((4,), ("pipe",))
  step = tj.schedule(M.chain_fn(KINDS), mesh=mesh, placement=graph,
                     num_microbatches=4, mode="infer")
  params, batch = _inputs()
  report = step.verify(params, batch, microbatches=2)
  assert report.ok and report.num_microbatches == 2 and report.mode == "infer"
  assert step.num_microbatches == 4
  with pytest.raises(tj.TesselError, match="microbatches"):
    step.verify(params, batch, microbatches=0)
