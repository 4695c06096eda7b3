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


def _forward_kernels(built):
  """The forward kernels of a build (kind ``F``)."""
  return [k for _, k in sorted(built.kernels.kernels.items())
          if k.kind == "F"]


def test_equal_blocks_of_two_plans_share_one_forward_linearisation(
    monkeypatch):
  """Every trace of a forward kernel outside ``shard_map`` (hoisted bytes,
  flops, profile) evaluates one linearisation per block content and avals
  (``block_vjp._FORWARDS``, filled by the residual probe): kernels of a
  second kernel set cut alike linearise nothing, and count the same
  flops."""
  from tessel_jax.cost import measure  # pylint: disable=import-outside-toplevel
  calls = []
  real = block_vjp.Vjp.vjp_of

  def counted(self, pvals, dvals):
    calls.append(self.blk.i)
    return real(self, pvals, dvals)
  monkeypatch.setattr(block_vjp.Vjp, "vjp_of", counted)
  monkeypatch.setattr(block_vjp, "_FORWARDS", type(block_vjp._FORWARDS)())  # pylint: disable=protected-access
  # Fresh probes too: a probe served from an earlier test's build would
  # not seed ``_FORWARDS`` (whatever ran before in this process).
  monkeypatch.setattr(block_vjp, "_PROBES", type(block_vjp._PROBES)())  # pylint: disable=protected-access
  fn, params, batch = _tiny()
  mesh = jax.make_mesh((2,), ("pipe",))
  avals = [jax.ShapeDtypeStruct(x.shape, x.dtype)
           for x in jax.tree_util.tree_leaves(params)]
  flops, traced = [], []
  for _ in range(2):  # two ScheduledFunctions: two kernel sets, equal cuts
    built = tj.schedule(fn, mesh=mesh, placement=placements.mshape(2),
                        num_microbatches=4, cost="uniform").build(
                            params, batch)
    kernels = _forward_kernels(built)
    del calls[:]
    flops.append([measure.kernel_flops(k, avals) for k in kernels])
    flops[-1] += [measure.kernel_flops(k, avals) for k in kernels]
    traced.append(len(calls))
  assert len(kernels) >= 2
  # The first set's kernels evaluate their blocks' residual probes, the
  # second set's the first's: nothing linearised again.
  assert traced == [0, 0]
  assert flops[0] == flops[1] and all(f for f in flops[0])


def test_a_shared_forward_computes_what_the_block_linearised_computes(
    monkeypatch):
  """A forward kernel evaluated from ``block_vjp._FORWARDS`` gives the
  outputs and stashed residuals of linearising its block on the spot."""
  monkeypatch.setattr(block_vjp, "_FORWARDS", type(block_vjp._FORWARDS)())  # pylint: disable=protected-access
  fn, params, batch = _tiny()
  built = tj.schedule(fn, mesh=jax.make_mesh((2,), ("pipe",)),
                      placement=placements.mshape(2), num_microbatches=4,
                      cost="uniform").build(params, batch)
  leaves = jax.tree_util.tree_leaves(params)
  rng = np.random.default_rng(0)
  for k in _forward_kernels(built):
    pvals = [leaves[l] for l in k.params]
    dvals = [jax.numpy.asarray(rng.uniform(-1, 1, a.shape), a.dtype)
             if jax.numpy.issubdtype(a.dtype, jax.numpy.inexact) else
             jax.numpy.zeros(a.shape, a.dtype) for a in k.in_avals]
    block_vjp._FORWARDS.clear()  # pylint: disable=protected-access
    before = block_vjp.FORWARD_STATS["traced"]
    shared = k.fn({"row_offset": 0}, pvals, dvals)
    assert block_vjp.FORWARD_STATS["traced"] == before + 1
    with monkeypatch.context() as m:
      m.setattr(block_vjp.Vjp, "_forward_key", lambda self, args: None)
      direct = k.fn({"row_offset": 0}, pvals, dvals)
    for a, b in zip(jax.tree_util.tree_leaves(shared),
                    jax.tree_util.tree_leaves(direct)):
      np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7)
