"""Each kernel body sits in the lowered program a bounded number of times.

A 2-stage MLP on vshape(2), N = 16: the copies of each kernel in the
compiled HLO (its ``dot`` instructions over those of one trace of it,
``experiments.hlo_breakdown``) must not grow with N or the ramps. Unrolled
ramps and one loop period hold at most 3 copies here (2 measured, 2026-11-25);
``interpret_ramps=0`` (every tick in one table-driven loop) holds exactly
one. Both programs equal ``jax.value_and_grad``.
"""

from __future__ import annotations

import jax
import numpy as np
import pytest

import tessel_jax as tj
from experiments import hlo_breakdown, lowering_bench_lib
from tessel_jax import placements

import test_lowering_models as M

N = 16
HIDDEN = 32
ROWS = 4


@pytest.mark.parametrize("plan,interpret_ramps,bound", [
    (None, 8, 3), ("1f1b", 8, 3), (None, 0, 1), ("gpipe", 0, 1)],
    ids=["searched", "1f1b", "searched-compact", "gpipe-compact"])
def test_kernel_bodies_are_not_duplicated(plan, interpret_ramps, bound):
  fn, params = lowering_bench_lib.chain_model(2, HIDDEN, 2)
  batch = lowering_bench_lib.make_batch(N * ROWS, HIDDEN)
  mesh = jax.make_mesh((2,), ("pipe",), devices=jax.devices()[:2])
  step = tj.schedule(fn, mesh=mesh, placement=placements.vshape(2),
                     num_microbatches=N, plan=plan, cut="markers",
                     interpret_ramps=interpret_ramps)
  loss, grads = step(params, batch)
  ref_loss, ref_grads = M.reference(fn, params, batch, N)
  assert M.max_rel_err(loss, ref_loss) <= 1e-5
  assert M.max_rel_err(grads, ref_grads) <= 1e-5
  text = step.lower(params, batch).compile().as_text()
  copies = hlo_breakdown.breakdown(step.built, text)["kernel_copies"]
  assert len(copies) == len(step.built.plan.kernels)  # every kernel has dots
  assert all(c >= 1 for c in copies.values()), copies
  assert max(copies.values()) <= bound, (step.built.plan.loop_summary(),
                                         copies)
  if interpret_ramps == 0:
    assert {s.kind for s in step.built.plan.segments} == {"interp"}
    np.testing.assert_array_equal(sorted(copies.values()),
                                  [1.0] * len(copies))
