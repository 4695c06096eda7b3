"""The vjp probe (``passes.block_vjp.Vjp.residual_avals``) is shared by
blocks of equal content: ``placement="auto"`` cuts the same program once
per placement, width and N, and equal cuts give equal blocks. Shared or
not, the lowered step equals ``jax.value_and_grad``."""

from __future__ import annotations

import jax
import numpy as np

import tessel_jax as tj
from tessel_jax import placements

try:
  from tessel_jax.passes import block_vjp
except ImportError:  # run from the repository root
  from passes import block_vjp

from test_cost import _tiny


def _check(step, fn, params, batch):
  loss, grads = step(params, batch)
  want_loss, want = jax.value_and_grad(fn)(params, batch)
  np.testing.assert_allclose(loss, want_loss, rtol=1e-5)
  for g, w in zip(jax.tree_util.tree_leaves(grads),
                  jax.tree_util.tree_leaves(want)):
    np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-6)


def test_equal_blocks_of_two_traces_share_one_probe(monkeypatch):
  probes = []
  real = block_vjp.Vjp._probe  # pylint: disable=protected-access

  def counted(self, pvals, dvals):
    probes.append(self.blk.i)
    return real(self, pvals, dvals)
  monkeypatch.setattr(block_vjp.Vjp, "_probe", counted)
  monkeypatch.setattr(block_vjp, "_PROBES", type(block_vjp._PROBES)())  # pylint: disable=protected-access
  fn, params, batch = _tiny()
  mesh = jax.make_mesh((2,), ("pipe",))
  counts = []
  for _ in range(2):
    # A new ScheduledFunction traces and cuts the program again.
    step = tj.schedule(fn, mesh=mesh, placement=placements.mshape(2),
                       num_microbatches=4, cost="uniform")
    step.build(params, batch)
    counts.append(len(probes))
  assert counts[0] >= 1 and counts[1] == counts[0]  # none in the 2nd build
  _check(step, fn, params, batch)
  # Other shapes (rows per micro-batch): other blocks, probed again.
  fn8, params8, batch8 = _tiny(rows_per_mb=8)
  tj.schedule(fn8, mesh=mesh, placement=placements.mshape(2),
              num_microbatches=4, cost="uniform").build(params8, batch8)
  assert len(probes) > counts[1]
