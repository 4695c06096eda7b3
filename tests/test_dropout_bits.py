"""Dropout in a block shared by all devices: the plain function's bits.

Block 0 runs on the 4 devices of mshape(4). Its dropout mask comes back as
an output (inference) and as a per-row aux leaf (training, ``has_aux``), and
must equal the plain function's mask bit for bit, not only give a close
loss:

* a key per row in the batch, or a closed-over key folded with each row's id
  from the batch (``fold_in``, as per-example code does): the block's rows
  are independent, so it splits them (each device draws its rows' bits);
* one closed-over key drawing the whole micro-batch's mask: a split would
  draw other bits, so the block runs replicated (named rule ``random_bits``)
  and every device draws the plain function's bits.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import tessel_jax as tj

import test_lowering_models as M

N, ROWS, H = 4, 4, 8
KEY = jax.random.PRNGKey(7)


def _row_key_mask(h, batch):
  keys = jax.vmap(jax.random.wrap_key_data)(batch["key"])
  return jax.vmap(lambda k: jax.random.bernoulli(k, 0.6, h.shape[1:]))(keys)


def _folded_mask(h, batch):
  keys = jax.vmap(lambda i: jax.random.fold_in(KEY, i))(batch["row"])
  return jax.vmap(lambda k: jax.random.bernoulli(k, 0.6, h.shape[1:]))(keys)


def _whole_mask(h, batch):
  del batch
  return jax.random.bernoulli(KEY, 0.6, h.shape)


def _fn(draw, mode):
  def fn(p, batch):
    h = jnp.tanh(batch["x"] @ p[0])
    keep = draw(h, batch)
    h = tj.boundary(jnp.where(keep, h / 0.6, 0.0))
    for i in range(1, 4):
      h = tj.boundary(jnp.tanh(h @ p[i]) + h)
    out = h @ p[4]
    mask = keep.astype(jnp.float32)
    if mode == "train":
      return jnp.mean((out - batch["y"]) ** 2), mask
    return out, mask
  return fn


def _data():
  ks = jax.random.split(jax.random.PRNGKey(0), 5)
  params = [jax.random.normal(k, (H, H)) * 0.4 for k in ks]
  rng = np.random.default_rng(1)
  rows = N * ROWS
  batch = {"x": jnp.asarray(rng.standard_normal((rows, H)), jnp.float32),
           "y": jnp.asarray(rng.standard_normal((rows, H)), jnp.float32),
           "key": jax.random.key_data(jax.random.split(jax.random.PRNGKey(3),
                                                       rows)),
           "row": jnp.arange(rows, dtype=jnp.uint32)}
  return params, batch


def _plain(fn, params, batch, mode):
  """Per micro-batch: (value, mask) and, training, the mean gradients."""
  mbs = [jax.tree_util.tree_map(lambda x, m=m: x[m * ROWS:(m + 1) * ROWS],
                                batch) for m in range(N)]
  if mode == "infer":
    outs = [fn(params, mb) for mb in mbs]
    return (jnp.concatenate([o for o, _ in outs]),
            jnp.stack([k for _, k in outs]))
  vg = [jax.value_and_grad(fn, has_aux=True)(params, mb) for mb in mbs]
  loss = sum(v[0][0] for v in vg) / N
  grads = jax.tree_util.tree_map(lambda *g: sum(g) / N, *[v[1] for v in vg])
  return (loss, jnp.stack([v[0][1] for v in vg])), grads


@pytest.mark.parametrize("draw,want_mode", [
    (_row_key_mask, "split"), (_folded_mask, "split"),
    (_whole_mask, "replicated")], ids=["batch_key", "folded_key", "one_key"])
@pytest.mark.parametrize("mode", ["train", "infer"])
def test_shared_block_dropout_masks_are_the_plain_bits(draw, want_mode, mode):
  fn = _fn(draw, mode)
  params, batch = _data()
  step = tj.schedule(fn, mesh=jax.make_mesh((4,), ("pipe",)),
                     placement=tj.placements.mshape(4, mode),
                     num_microbatches=N, mode=mode, has_aux=True,
                     solver_time_limit_s=10.0)
  got = step(params, batch)
  want = _plain(fn, params, batch, mode)
  block0 = step.built.kernels.modes[0]
  assert block0.mode == want_mode, block0
  if want_mode == "replicated":
    assert "random_bits" in block0.reason
  if mode == "train":
    (loss, mask), grads = got
    (want_loss, want_mask), want_grads = want
    assert M.max_rel_err(loss, want_loss) <= 1e-5
    assert M.max_rel_err(grads, want_grads) <= 1e-5
  else:
    (out, mask), (want_out, want_mask) = got, want
    assert M.max_rel_err(out, want_out) <= 1e-5
  np.testing.assert_array_equal(np.asarray(mask), np.asarray(want_mask))
  assert np.asarray(mask).shape == (N, ROWS, H)
  assert 0.3 < float(np.mean(np.asarray(mask))) < 0.9
