"""A step first called inside the user's own ``jax.jit``.

Users wrap the step in their training step (``jax.jit`` over the step and
the optimizer update). The first call then builds inside that trace: the
build's kernel profile (``cost="measured"``, the default) must still time
real arrays, and the program must still equal ``jax.value_and_grad``.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import tessel_jax as tj

TOL = 1e-5

def _fn(p, batch):
  h = batch["x"]
  for i in range(3):
    h = tj.boundary(jnp.tanh(h @ p["w"][i]) + h)
  return jnp.mean((h @ p["w"][3] - batch["y"]) ** 2)


def _inputs(rows: int = 16):
  rng = np.random.default_rng(0)
  params = {"w": jnp.asarray(rng.standard_normal((4, 8, 8)) * 0.3,
                             jnp.float32)}
  batch = {k: jnp.asarray(rng.standard_normal((rows, 8)), jnp.float32)
           for k in ("x", "y")}
  return params, batch


def _reference(params, batch, n):
  def mean_loss(p):
    parts = [_fn(p, jax.tree.map(lambda x, i=i: x.reshape(
        (n, -1) + x.shape[1:])[i], batch)) for i in range(n)]
    return sum(parts) / n
  return jax.value_and_grad(mean_loss)(params)


def _max_rel(a, b) -> float:
  return max(float(jnp.max(jnp.abs(x - y)) / (jnp.max(jnp.abs(y)) + 1e-30))
             for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)))


@pytest.mark.parametrize("cost", ["measured", "uniform"])
def test_a_cold_step_built_inside_the_callers_jit(tmp_path, cost):
  params, batch = _inputs()
  mesh = jax.make_mesh((4,), ("pipe",))   # Explicit axes on JAX 0.10
  step = tj.schedule(_fn, mesh=mesh,
                     placement=tj.Placement([0, 1, 2, (0, 1, 2, 3)]),
                     num_microbatches=4, cost=cost, cache_dir=str(tmp_path))

  @jax.jit
  def train_step(p, b):
    loss, grads = step(p, b)
    # The gradients mixed with values typed on the user's mesh, as an
    # optimizer's state would be (optax.adam failed at the second step).
    moment = jax.tree.map(lambda w: jax.sharding.reshard(
        0.0 * w, jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())), p)
    grads = jax.tree.map(lambda g, m: g + m, grads, moment)
    return loss, jax.tree.map(lambda w, g: w - 0.1 * g, p, grads)

  got, want = params, params
  for _ in range(2):  # the second step reads the first's (typed) outputs
    loss, got = train_step(got, batch)
    ref_loss, ref_grads = _reference(want, batch, 4)
    want = jax.tree.map(lambda w, g: w - 0.1 * g, want, ref_grads)
    assert abs(float(loss) - float(ref_loss)) <= TOL * abs(float(ref_loss))
    assert _max_rel(got, want) <= TOL
  # The loss block is split 4 ways with partial sums (its probe ran with
  # concrete values inside the trace).
  assert step.built.kernels.modes[3].summed == ((0, 0.25),)
  if cost == "measured":
    assert step.report.block_ms, "no kernel was timed"



def test_a_cold_step_built_inside_a_scan_over_training_steps(tmp_path):
  params, batch = _inputs()
  step = tj.schedule(_fn, mesh=jax.make_mesh((2,), ("pipe",)),
                     placement=tj.placements.interleaved(2),
                     num_microbatches=4,
                     cache_dir=str(tmp_path))

  def one(p, _):
    loss, grads = step(p, batch)
    return jax.tree.map(lambda w, g: w - 0.1 * g, p, grads), loss

  got_params, losses = jax.jit(
      lambda p: jax.lax.scan(one, p, None, length=2))(params)
  want_params, want_losses = params, []
  for _ in range(2):
    loss, grads = _reference(want_params, batch, 4)
    want_losses.append(float(loss))
    want_params = jax.tree.map(lambda w, g: w - 0.1 * g, want_params, grads)
  np.testing.assert_allclose(np.asarray(losses), want_losses, rtol=TOL)
  assert _max_rel(got_params, want_params) <= TOL


@pytest.mark.parametrize("mode", ["train", "infer"])
def test_differentiating_through_the_step_is_refused_with_the_fix(
    tmp_path, mode):
  params, batch = _inputs()
  step = tj.schedule(_fn, mesh=jax.make_mesh((4,), ("pipe",)),
                     placement=tj.placements.vshape(4), num_microbatches=4,
                     mode=mode, cost="uniform", cache_dir=str(tmp_path))
  step(params, batch)   # built and run: differentiating is what fails

  def loss(p):
    out = step(p, batch)
    return out[0] if mode == "train" else jnp.sum(out)

  for transform in (jax.grad, lambda f: jax.jit(jax.grad(f))):
    with pytest.raises(tj.TesselError) as err:
      transform(loss)(params)
    text = str(err.value)
    assert "applied to '_fn'" in text and "params['w'] is being" in text
    fix = ("Use the gradients it returns" if mode == "train"
           else "schedule the loss with mode='train'")
    assert fix in text, text
