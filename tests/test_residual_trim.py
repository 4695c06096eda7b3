"""Residuals that ``B`` rebuilds cheaply are not stashed
(``passes.residual_trim``).

``tanh``'s vjp (jax 0.10) keeps ``t = tanh(z)`` and ``1 - t``: a 4-layer block of the
4-stage MLP of ``experiments.peer_bench`` stashed 9 activations per
micro-batch where 5 carry everything (the input and each layer's ``t``).
The rebuilt residuals must equal the ones the vjp kept, and the lowered
step must still equal ``jax.value_and_grad``.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

import tessel_jax as tj
from experiments import lowering_bench_lib, peer_bench_lib, peer_gpipe
from tessel_jax import compat, placements

try:
  from tessel_jax.passes import residual_trim
  from tessel_jax.passes.switches import Switches
except ImportError:  # run from the repository root
  from passes import residual_trim
  from passes.switches import Switches

import conv_models
import test_lowering_models as M

HIDDEN = 24
ROWS = 8


def _vjp_residuals(ws, x):
  """The vjp residuals (not the weights) of a chain of ``tanh(h @ w)``."""

  def f(ws, x):
    for w in ws:
      x = jnp.tanh(x @ w)
    return x
  _, vjp = jax.vjp(f, ws, x)
  return [l for l in jax.tree_util.tree_leaves(vjp)
          if not any(l is w for w in ws)]


def _residuals(ws, x):
  """What jax 0.10's vjp keeps for a chain of ``tanh(h @ w)``: ``x``, then
  ``t`` and ``1 - t`` per layer (jax >= 0.11 keeps ``t`` alone), written
  out so the test does not depend on the JAX version."""
  out = [x]
  for w in ws:
    t = jnp.tanh(x @ w)
    out += [t, 1.0 - t]
    x = t
  return out


def _vjp_keeps_rebuildable(hidden: int = 4) -> bool:
  """Whether this JAX's tanh vjp keeps a residual ``residual_trim``
  rebuilds (jax 0.10: ``1 - t``; jax >= 0.11: no)."""
  ws = [jnp.ones((hidden, hidden), jnp.float32)]
  x = jnp.ones((2, hidden), jnp.float32)
  closed, _ = compat.make_jaxpr(_vjp_residuals, ws, x)
  recipe = residual_trim.find(closed, len(ws))
  return len(recipe.kept) < recipe.count


def test_tanh_chain_keeps_input_and_outputs_only():
  rng = np.random.default_rng(0)
  ws = [jnp.asarray(rng.normal(size=(HIDDEN, HIDDEN)), jnp.float32)
        for _ in range(3)]
  x = jnp.asarray(rng.normal(size=(ROWS, HIDDEN)), jnp.float32)
  closed, _ = compat.make_jaxpr(_residuals, ws, x)
  recipe = residual_trim.find(closed, len(ws))
  full = _residuals(ws, x)
  assert recipe.count == len(full) == 7   # x, then t and 1 - t per layer
  assert len(recipe.kept) == 4            # x and each layer's t
  got = recipe.rebuild(recipe.keep(full), ws)
  for a, b in zip(got, full):
    np.testing.assert_array_equal(a, b)
  assert residual_trim.find(closed, len(ws), enabled=False).kept == tuple(
      range(7))


def test_a_value_kept_twice_is_stashed_once():
  def twice(w, x):
    s = jnp.sin(x)
    return [s, x * 2.0, s]
  closed, _ = compat.make_jaxpr(twice, jnp.ones(3), jnp.ones(3))
  recipe = residual_trim.find(closed, 1)
  assert recipe.kept == (0, 1)  # x * 2.0 stays: x is not a residual
  closed, _ = compat.make_jaxpr(lambda w, x: [x, x * 2.0, jnp.sin(x), x],
                                jnp.ones(3), jnp.ones(3))
  recipe = residual_trim.find(closed, 1)
  assert recipe.kept == (0, 2)
  vals = [jnp.arange(3.0), None, jnp.sin(jnp.arange(3.0)), None]
  got = recipe.rebuild([vals[0], vals[2]], [jnp.ones(3)])
  np.testing.assert_array_equal(got[1], 2.0 * vals[0])
  np.testing.assert_array_equal(got[3], vals[0])


def test_mshape_stashes_less_and_stays_exact():
  """mshape(4) of the 4-stage MLP (2 shared layers, then 1 per device):
  the stash shrinks (checked 2026-11-26: the shared block's residuals
  5 -> 3 per micro-batch, the own blocks' 3 -> 2) and the step equals
  ``jax.value_and_grad``."""
  params = peer_gpipe.mlp_params(6, HIDDEN, 0)
  batch = lowering_bench_lib.make_batch(8 * ROWS, HIDDEN)
  mesh = jax.make_mesh((4,), ("pipe",), devices=jax.devices()[:4])
  fn = peer_bench_lib.marked_loss([2, 1, 1, 1, 1])
  sched = None
  res = {}
  for trim in (False, True):
    step = tj.schedule(fn, mesh=mesh, placement=placements.mshape(4),
                       num_microbatches=8, cut="markers", cost="uniform",
                       plan=sched, switches=Switches(residual_trim=trim))
    loss, grads = step(params, batch)
    sched = step.built.unrolled   # the same schedule for both
    ref_loss, ref_grads = M.reference(fn, params, batch, 8)
    assert M.max_rel_err(loss, ref_loss) <= 1e-5
    assert M.max_rel_err(grads, ref_grads) <= 1e-5
    res[trim] = sorted(len(k.inputs) for k in step.built.kernels.kernels.values()
                       if k.kind == "B")
  if _vjp_keeps_rebuildable():
    assert sum(res[True]) < sum(res[False]), res
  else:  # nothing to trim: the switch must change nothing
    assert res[True] == res[False], res


def _slice_residuals(w, x):
  """The vjp residuals (not ``w``) of a 3x3 convolution on a 1x1 map that
  reads its kernel's centre tap (``passes.dead_taps``' slice of a slice)."""

  def f(w, x):
    tap = jax.lax.slice_in_dim(jax.lax.slice_in_dim(w, 1, 2, axis=0), 1, 2,
                               axis=1)
    return jax.lax.conv_general_dilated(
        x, tap, (1, 1), "SAME", dimension_numbers=("NHWC", "HWIO", "NHWC"))
  _, vjp = jax.vjp(f, w, x)
  return [l for l in jax.tree_util.tree_leaves(vjp) if l is not w]


def test_a_slice_of_a_parameter_is_rebuilt_not_stashed():
  rng = np.random.default_rng(0)
  w = jnp.asarray(rng.normal(size=(3, 3, 8, 8)), jnp.float32)
  x = jnp.asarray(rng.normal(size=(4, 1, 1, 8)), jnp.float32)
  closed, _ = compat.make_jaxpr(_slice_residuals, w, x)
  full = _slice_residuals(w, x)
  taps = [k for k, r in enumerate(full) if r.shape == (1, 1, 8, 8)]
  assert taps, [r.shape for r in full]  # the vjp keeps the sliced kernel
  recipe = residual_trim.find(closed, 1)
  assert not set(taps) & set(recipe.kept), recipe.kept  # old code: kept
  got = recipe.rebuild(recipe.keep(full), [w])
  for a, b in zip(got, full):
    np.testing.assert_array_equal(a, b)


def test_dead_tap_kernels_are_not_stashed():
  """ResNet18's stage 3/4 forwards stashed every sliced 3x3 kernel (1 MB
  per 512x512 tap, per micro-batch) for their backward to transpose; B
  now slices the parameter again (hoisted: once per step)."""
  fn, params, batch = conv_models.two_convs(1, 16, 8)
  mesh = jax.make_mesh((2,), ("pipe",), devices=jax.devices()[:2])
  step = tj.schedule(fn, mesh=mesh, placement=placements.vshape(2),
                     num_microbatches=4, cut="markers", cost="uniform")
  loss, grads = step(params, batch)
  ref_loss, ref_grads = M.reference(fn, params, batch, 4)
  assert M.max_rel_err(loss, ref_loss) <= 1e-5
  assert M.max_rel_err(grads, ref_grads) <= 1e-5
  stashed = [tuple(a.shape) for k in step.built.kernels.kernels.values()
             if k.kind == "F" for a in k.out_avals]
  assert (1, 1, 16, 16) not in stashed, stashed  # old code: one per block
