"""A kernel is profiled as the ticks run it (``cost.tick_kernel``).

The lowering computes a kernel's parameter-only values once per step
(``passes.hoist``); the profile used to time the kernel alone with them
recomputed at every call. Here each layer reads ``W @ W.T`` of a 128x128
weight (2.1 MFLOP of parameter-only work against 4 rows x 128 x 128 per
micro-batch): the profiled kernels' flops must leave it out, and the
lowered program still equals ``jax.value_and_grad``. Every kernel is
compiled inside a ``lax.cond`` branch, as the ticks run it (XLA's CPU
backend compiles nested computations differently).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

import tessel_jax as tj
from tessel_jax import placements
from tessel_jax.cost import measure, tick_kernel
from tessel_jax.passes import param_only
from tessel_jax.passes.switches import Switches

import test_lowering_models as M

N = 4
D = 128
PARAM_ONLY_FLOPS = 2 * D ** 3  # W @ W.T


def gram_model():
  """``loss(params, batch)``: 2 layers ``tanh(x @ (W @ W.T))``, a cut
  between them."""
  keys = jax.random.split(jax.random.PRNGKey(0), 2)
  params = {"w": [jax.random.normal(k, (D, D)) * 0.05 for k in keys]}

  def loss(p, batch):
    x = batch["x"]
    for i, w in enumerate(p["w"]):
      x = jnp.tanh(x @ (w @ w.T))
      if i == 0:
        x = tj.boundary(x)
    return jnp.mean(x ** 2)

  batch = {"x": jax.random.normal(jax.random.PRNGKey(1), (N * 4, D))}
  return loss, params, batch


def _step(fn, hoist: bool, cost: str = "measured"):
  mesh = jax.make_mesh((2,), ("pipe",), devices=jax.devices()[:2])
  return tj.schedule(fn, mesh=mesh, placement=placements.vshape(2),
                     num_microbatches=N, cut="markers", cost=cost,
                     switches=Switches(hoist=hoist, coarse_grid=False))


def _forward_kernels(fn, params, batch):
  """``(param avals, forward kernels)`` of ``fn`` built on vshape(2) with
  uniform costs and hoisting on."""
  built = _step(fn, True, "uniform").build(params, batch)
  fwd = [k for k in built.kernels.kernels.values() if k.kind == "F"]
  assert fwd
  return built.partition.traced.param_avals, fwd


def test_lower_kernel_leaves_the_parameter_only_work_out():
  avals, fwd = _forward_kernels(*gram_model())
  dev = jax.devices()[0]
  for k in fwd:
    plain = measure.lower_kernel(k, avals, dev).flops
    ticked = measure.lower_kernel(k, avals, dev, hoist=True).flops
    assert plain - ticked >= 0.9 * PARAM_ONLY_FLOPS, (k.label, plain, ticked)
    p, d = measure.kernel_avals(k, avals)
    assert tick_kernel.traced(k, p, d, True).hoisted
    assert not tick_kernel.traced(k, p, d, False).hoisted
    assert (measure.kernel_key(k, avals, dev, hoist=True)
            != measure.kernel_key(k, avals, dev))


def test_measured_build_profiles_hoisted_kernels_without_their_prelude():
  fn, params, batch = gram_model()
  flops = {}
  for hoist in (True, False):
    step = _step(fn, hoist)
    loss, grads = step(params, batch)
    recs = step._costs.memo.kernels.values()  # pylint: disable=protected-access
    flops[hoist] = sorted(r["flops"] for r in recs
                          if r.get("label", "").startswith("F"))
    ref_loss, ref_grads = M.reference(fn, params, batch, N)
    np.testing.assert_allclose(loss, ref_loss, rtol=1e-5)
    for g, r in zip(jax.tree.leaves(grads), jax.tree.leaves(ref_grads)):
      np.testing.assert_allclose(g, r, rtol=1e-4, atol=1e-6)
  assert flops[True] and len(flops[True]) == len(flops[False])
  for on, off in zip(flops[True], flops[False]):
    assert off - on >= 0.9 * PARAM_ONLY_FLOPS, (on, off)


def test_lower_kernel_compiles_the_kernel_inside_a_branch():
  fn, params, batch = gram_model()
  built = _step(fn, False, "uniform").build(params, batch)
  avals = built.partition.traced.param_avals
  dev = jax.devices()[0]
  for k in built.kernels.kernels.values():
    job = measure.lower_kernel(k, avals, dev)
    assert len(job.dv) == len(k.in_avals) + 1       # the branch flag last
    assert " conditional(" in job.lowered.compile().as_text(), k.label


def dropout_model():
  """``loss(params, batch)``: 2 layers ``tanh(x @ W)`` times a dropout
  mask drawn from a key the function captures (a constant, as nnx's
  ``Rngs`` stream in the zoo's nnx_transformer), a cut between them."""
  keys = jax.random.split(jax.random.PRNGKey(0), 2)
  params = {"w": [jax.random.normal(k, (D, D)) * 0.05 for k in keys]}
  drop = jax.random.key(7)

  def loss(p, batch):
    x = batch["x"]
    for i, w in enumerate(p["w"]):
      keep = jax.random.bernoulli(jax.random.fold_in(drop, i), 0.9, x.shape)
      x = jnp.where(keep, jnp.tanh(x @ w) / 0.9, 0.0)
      if i == 0:
        x = tj.boundary(x)
    return jnp.mean(x ** 2)

  batch = {"x": jax.random.normal(jax.random.PRNGKey(1), (N * 4, D))}
  return loss, params, batch


def test_profile_leaves_out_work_on_captured_constants_alone():
  """XLA draws a mask from a constant key once per step, out of the tick
  loop; the profile of a kernel the lowering hoists leaves the draw out
  (``param_only.find(constants=True)``), the lowering's own hoist does not
  take it (``constants=False``), and a measured build still equals
  ``jax.value_and_grad``."""
  fn, params, batch = dropout_model()
  avals, fwd = _forward_kernels(fn, params, batch)
  dev = jax.devices()[0]
  for k in fwd:
    p, d = measure.kernel_avals(k, avals)
    f = tick_kernel.traced(k, p, d, True)
    assert any(v.aval.dtype == jnp.bool_ and v.aval.shape == (4, D)
               for v in f.hoisted), (k.label, f.hoisted)
    assert not param_only.find(f.closed, f.params[:len(p)]).hoisted
    ticked = measure.lower_kernel(k, avals, dev, hoist=True)
    plain = measure.lower_kernel(k, avals, dev)
    drawn = lambda job: "threefry" in job.lowered.as_text()
    assert drawn(plain) and not drawn(ticked), k.label
  loss, grads = _step(fn, True)(params, batch)
  ref_loss, ref_grads = M.reference(fn, params, batch, N)
  np.testing.assert_allclose(loss, ref_loss, rtol=1e-5)
  for g, r in zip(jax.tree.leaves(grads), jax.tree.leaves(ref_grads)):
    np.testing.assert_allclose(g, r, rtol=1e-4, atol=1e-6)
