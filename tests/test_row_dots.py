"""Few-row dots against a weight take their input cotangent with the
weight as the left operand (``passes.row_dots``, ``Switches.row_dots``).

The rewrite must give ``x @ W``'s value and gradients, pick only
``x @ W`` of a few rows against a large parameter, and the lowered
``mshape(4)`` step (the shared block split to 16 rows per device) must
compute ``(W @ dy.T)`` -- a ``[256, 16]`` dot -- and still equal
``jax.value_and_grad``.
"""

from __future__ import annotations

import re

import jax
import jax.numpy as jnp
import numpy as np

import tessel_jax as tj
from experiments import lowering_bench_lib, peer_bench_lib, peer_gpipe
from tessel_jax import placements
from tessel_jax.cost import kernel_keys

try:
  from tessel_jax.passes import row_dots
  from tessel_jax.passes.partition import ForwardBlock, Source
  from tessel_jax.passes.switches import Switches
except ImportError:  # run from the repository root
  from passes import row_dots
  from passes.partition import ForwardBlock, Source
  from passes.switches import Switches

import test_lowering_models as M

HIDDEN = 256
ROWS = 64


def test_row_dot_equals_matmul_and_its_vjp():
  rng = np.random.default_rng(0)
  x = jnp.asarray(rng.normal(size=(16, HIDDEN)), jnp.float32)
  w = jnp.asarray(rng.normal(size=(HIDDEN, 384)), jnp.float32)
  g = jnp.asarray(rng.normal(size=(16, 384)), jnp.float32)
  y, vjp = jax.vjp(row_dots.row_dot, x, w)
  y0, vjp0 = jax.vjp(jnp.matmul, x, w)
  np.testing.assert_allclose(y, y0, rtol=1e-6)
  for a, b in zip(vjp(g), vjp0(g)):
    np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-4)
  # The forward form: w.T given (hoisted in a program), no cotangent to it.
  yt, vjpt = jax.vjp(lambda x, w: row_dots.row_dot_t(
      x, w, jax.lax.stop_gradient(w).T), x, w)
  np.testing.assert_allclose(yt, y0, rtol=1e-5, atol=1e-4)
  for a, b in zip(vjpt(g), vjp0(g)):
    np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-4)


def _block(fn, *args, kinds):
  closed = jax.make_jaxpr(fn)(*args)
  j = closed.jaxpr
  return ForwardBlock(
      index=0, eqns=tuple(j.eqns), invars=tuple(j.invars),
      inputs=tuple(Source(kind=k, index=i) for i, k in enumerate(kinds)),
      const_vars=tuple(j.constvars), const_vals=tuple(closed.consts),
      outvars=tuple(j.outvars),
      in_avals=tuple(jax.ShapeDtypeStruct(a.shape, a.dtype) for a in args),
      out_avals=tuple(jax.ShapeDtypeStruct(v.aval.shape, v.aval.dtype)
                      for v in j.outvars))


def test_only_few_row_dots_against_large_parameters():
  w = jnp.ones((HIDDEN, HIDDEN))
  f = lambda x, w: jnp.tanh(x @ w) @ w  # pylint: disable=unnecessary-lambda-assignment
  few = _block(f, jnp.ones((16, HIDDEN)), w, kinds=("batch", "param"))
  assert row_dots.count([few]) == 2
  assert row_dots.count([_block(f, jnp.ones((128, HIDDEN)), w,
                                kinds=("batch", "param"))]) == 0
  assert row_dots.count([_block(f, jnp.ones((16, HIDDEN)), w,
                                kinds=("batch", "act"))]) == 0
  exact = lambda x, w: jnp.matmul(  # pylint: disable=unnecessary-lambda-assignment
      x, w, precision=jax.lax.Precision.HIGHEST)
  assert row_dots.count([_block(exact, jnp.ones((16, HIDDEN)), w,
                                kinds=("batch", "param"))]) == 0
  small = jnp.ones((64, 64))
  assert row_dots.count([_block(f, jnp.ones((16, 64)), small,
                                kinds=("batch", "param"))]) == 0
  new = row_dots.rewrite(few)
  assert new is not few and row_dots.count([new]) == 0
  x = jnp.asarray(np.random.default_rng(1).normal(size=(16, HIDDEN)),
                  jnp.float32)
  np.testing.assert_allclose(new(x, w)[0], few(x, w)[0], rtol=1e-6)
  both = row_dots.rewrite(few, forward=True)
  assert row_dots.count([both]) == 0
  np.testing.assert_allclose(both(x, w)[0], few(x, w)[0], rtol=1e-5,
                             atol=1e-5)


def _weight_lhs_dots(step, params, batch) -> int:
  text = step.built.jitted.lower(params, batch).compile().as_text()
  return len(re.findall(rf"f32\[{HIDDEN},{ROWS // 4}\]\{{1,0\}} dot\(",
                        text))


def test_mshape_reads_weights_in_place_and_stays_exact():
  params = peer_gpipe.mlp_params(6, HIDDEN, 0)
  batch = lowering_bench_lib.make_batch(4 * ROWS, HIDDEN)
  mesh = jax.make_mesh((4,), ("pipe",), devices=jax.devices()[:4])
  fn = peer_bench_lib.marked_loss([2, 1, 1, 1, 1])
  ref_loss, ref_grads = M.reference(fn, params, batch, 4)
  sched, found, kernels = None, {}, {}
  for on in (False, True):
    step = tj.schedule(fn, mesh=mesh, placement=placements.mshape(4),
                       num_microbatches=4, cut="markers", cost="uniform",
                       plan=sched, switches=Switches(row_dots=on))
    loss, grads = step(params, batch)
    sched = step.built.unrolled
    assert M.max_rel_err(loss, ref_loss) <= 1e-5
    assert M.max_rel_err(grads, ref_grads) <= 1e-5
    found[on] = _weight_lhs_dots(step, params, batch)
    kernels[on] = step.built.kernels.kernels
  assert found[False] == 0 and found[True] > 0, found
  # The rewritten kernels are told apart in the cost cache's key.
  rewritten = [i for i, k in kernels[True].items() if k.rewrites]
  assert rewritten and not any(k.rewrites for k in kernels[False].values())
  assert all(kernel_keys._structure(kernels[True][i])
             != kernel_keys._structure(kernels[False][i]) for i in rewritten)
