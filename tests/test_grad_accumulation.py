"""Gradient accumulators are touched only where their block runs.

Counts parameter-sized instructions in the compiled HLO of a small 2-stage
pipeline (vshape(2): every tick runs different blocks on the two devices,
so every tick is a switch): no add, select, copy or zero fill of a
parameter-sized buffer in code every device runs (the loop bodies and the
unrolled ticks outside branches), none in a loop's branches but the adds
of the blocks that own the gradients. The compact lowering (every tick in
one table-driven loop, ``interpret_ramps=0``) runs each kernel in a loop of
its own that only its devices enter at its ticks: no parameter-sized copy,
select or zero fill anywhere in the loops, and exactly one add per gradient
a kernel owns.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import tessel_jax as tj
from experiments import hlo_count, lowering_bench_lib
from tessel_jax import placements

HIDDEN = 24       # parameter shapes (24, 24) and (24,): no activation has them
ROWS = 8


def _lower(plan, param_layout, interpret_ramps=8):
  fn, params = lowering_bench_lib.chain_model(2, HIDDEN, 2)
  n = 6
  batch = lowering_bench_lib.make_batch(n * ROWS, HIDDEN)
  mesh = jax.make_mesh((2,), ("pipe",), devices=jax.devices()[:2])
  step = tj.schedule(fn, mesh=mesh, placement=placements.vshape(2),
                     num_microbatches=n, plan=plan, cut="markers",
                     param_layout=param_layout,
                     interpret_ramps=interpret_ramps)
  loss, grads = step(params, batch)
  ref_loss, ref_grads = jax.value_and_grad(
      lambda p: jnp.mean(jnp.stack([fn(p, jax.tree_util.tree_map(
          lambda x: x[i * ROWS:(i + 1) * ROWS], batch)) for i in range(n)])))(
              params)
  np.testing.assert_allclose(loss, ref_loss, rtol=1e-5)
  for a, b in zip(jax.tree_util.tree_leaves(grads),
                  jax.tree_util.tree_leaves(ref_grads)):
    np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
  layout = step.built.layout
  shapes = [(HIDDEN, HIDDEN), (HIDDEN,)]
  shapes += [(layout.size[dt],) for dt in layout.dtypes]
  shapes += [(r.length,) for dt in layout.dtypes
             for r in layout.regions[dt].values()]
  return step, hlo_count.param_ops(
      step.lower(params, batch).compile().as_text(), shapes)


@pytest.mark.parametrize("plan,param_layout", [
    (None, "auto"), ("1f1b", "auto"), ("gpipe", "auto"), (None, "flat")])
def test_accumulators_touched_only_by_their_branch(plan, param_layout):
  step, ops = _lower(plan, param_layout)
  if param_layout == "flat":
    assert step.built.layout.dtypes and not step.built.layout.classes
  else:
    assert step.built.layout.classes
  # Nothing parameter-sized per tick outside the branches (the accumulators
  # are zero-filled and copied only once, before the first tick).
  assert ops["loop"] == {op: 0 for op in hlo_count.OPS}, ops
  assert ops["once"]["add"] == 0 and ops["once"]["select"] == 0, ops
  # Branches that do not own an accumulator pass it through: no zero-filled
  # gradients, no copies; the owners add in place.
  for op in ("broadcast", "copy", "select"):
    assert ops["loop_branches"][op] == 0, ops
  assert ops["loop_branches"]["add"] > 0, ops


@pytest.mark.parametrize("plan", [None, "1f1b"])
def test_compact_accumulators_touched_only_by_their_kernel(plan):
  step, ops = _lower(plan, "auto", interpret_ramps=0)
  assert {s.kind for s in step.built.plan.segments} == {"interp"}
  for where in ("loop", "loop_branches"):
    for op in ("broadcast", "copy", "select"):
      assert ops[where][op] == 0, ops
  owned = sum(len(k.grads) for k in step.built.plan.kernels.values())
  assert owned and ops["loop"]["add"] + ops["loop_branches"]["add"] == owned, (
      owned, ops)
