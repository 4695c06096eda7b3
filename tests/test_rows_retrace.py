"""A split block runs the function re-traced at ``b / g`` rows: exact pairing.

The re-trace may export a block's values in another order than the full
trace (the order comes from where later blocks read them, which model code
may change with the batch size, as Hugging Face's GPT-2 does), and may make
batch-sized values that do not depend on the batch (an attention mask of
ones) ``b / g`` rows long. ``passes.align`` pairs exports by where they are
computed; ``passes.row_scaling`` slices such values like batch values where
that is exact and refuses the split by name where it is not.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import tessel_jax as tj

import test_lowering_models as M

TOL = 1e-5


def _params(hidden=8, seed=0):
  ks = jax.random.split(jax.random.PRNGKey(seed), 6)
  return {"w": [jax.random.normal(k, (hidden, hidden)) * 0.4 for k in ks],
          "pos": jax.random.normal(ks[5], (64, hidden))}


def _batch(rows, hidden=8, seed=1):
  rng = np.random.default_rng(seed)
  return {"x": jnp.asarray(rng.standard_normal((rows, hidden)), jnp.float32),
          "y": jnp.asarray(rng.standard_normal((rows, hidden)), jnp.float32)}


def _reordering(bias, train=True):
  """Block 0 (all devices on mshape) exports three values of one shape that
  block 1 reads in another order when the batch has one row, plus ``bias``:
  a batch-sized value that does not depend on the batch."""
  def fn(p, batch):
    x = batch["x"]
    h = jnp.tanh(x @ p["w"][0])
    a = jnp.sin(h)
    m = bias(p, x)
    h = tj.boundary(h)
    if x.shape[0] == 1:  # the per-device re-trace reads m, a, h
      m2, a2, h2 = m * 0.5, a * 3.0, h @ p["w"][1]
    else:  # the full trace reads a, h, m
      a2 = a * 3.0
      h2 = h @ p["w"][1]
      m2 = m * 0.5
    h = jnp.tanh(h2 + a2) + m2
    for i in range(2, 5):
      h = tj.boundary(jnp.tanh(h @ p["w"][i]) + h)
    if train:
      return jnp.mean((h - batch["y"]) ** 2)
    return h
  return fn


def _ones(p, x):
  del p
  return jnp.ones(x.shape, x.dtype)          # like HF's attention mask


def _param_rows(p, x):
  return p["pos"][:x.shape[0], :x.shape[1]]  # rows 0..b-1 of a parameter


def _run(fn, mode, n=4, rows=4):
  params, batch = _params(), _batch(n * rows)
  step = tj.schedule(fn, mesh=jax.make_mesh((4,), ("pipe",)),
                     placement=tj.placements.mshape(4, mode),
                     num_microbatches=n, mode=mode, solver_time_limit_s=10.0)
  got = step(params, batch)
  want = (M.reference(fn, params, batch, n) if mode == "train" else
          M.reference_infer(fn, params, batch, n))
  assert M.max_rel_err(got, want) <= TOL
  return step


@pytest.mark.parametrize("mode", ["train", "infer"])
def test_reordered_exports_split_exactly(mode):
  step = _run(_reordering(_ones, mode == "train"), mode)
  assert step.built.kernels.modes[0].mode == "split"
  ks = step.built.kernels
  f0 = ks.kernels[ks.forward_ids[0]]
  # Every export of the split block is its device's one row, the ones mask
  # included (assembled from the devices' rows like a batch value).
  assert all(a.shape[0] == 1 for a in f0.out_avals)


def test_batch_sized_parameter_slice_is_replicated_by_name():
  step = _run(_reordering(_param_rows), "train")
  mode = step.built.kernels.modes[0]
  assert mode.mode == "replicated"
  assert "has the batch's size without depending on the batch" in mode.reason


def test_aligned_partition_pairs_values_by_where_they_are_computed():
  from passes import align, partition, tracing  # pylint: disable=import-outside-toplevel
  fn = _reordering(_ones)
  params = _params()
  avals = lambda t: jax.tree_util.tree_map(  # noqa: E731
      lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), t)
  full = partition.partition(tracing.trace(fn, "f", avals(params),
                                           avals(_batch(4))))
  raw = partition.partition(tracing.trace(fn, "f", avals(params),
                                          avals(_batch(1))))
  # The re-trace exports block 0's values in another order ...
  assert raw.blocks[1].inputs != full.blocks[1].inputs
  got = align.align_partition(full, raw)
  for fb, lb in zip(full.blocks, got.blocks):
    assert lb.inputs == fb.inputs
    assert [a.shape[1:] for a in lb.out_avals] == [
        a.shape[1:] for a in fb.out_avals]
  # ... and aligned, each local export is the full one's first row.
  xs = [np.ones(a.shape, a.dtype) if s.kind != "param" else
        np.asarray(jax.tree_util.tree_leaves(params)[s.index])
        for a, s in zip(full.blocks[0].in_avals, full.blocks[0].inputs)]
  want = full.blocks[0](*xs)
  have = got.blocks[0](*[x[:1] if s.kind == "batch" else x for x, s in
                         zip(xs, full.blocks[0].inputs)])
  for w, h in zip(want, have):
    np.testing.assert_allclose(np.asarray(w)[:1], np.asarray(h), rtol=1e-6)


def test_hugging_face_gpt2_splits_its_shared_block(monkeypatch):
  pytest.importorskip("transformers")
  pytest.importorskip("flax")
  from experiments import model_zoo_lib as Z  # pylint: disable=import-outside-toplevel
  from experiments import model_zoo_models  # pylint: disable=import-outside-toplevel
  # Two transformer layers, not the zoo's four: the shared block (the tied
  # embedding, F0 on 4 devices) is the same; the programs compile in half
  # the time.
  monkeypatch.setattr(model_zoo_models, "LAYERS", 2)
  n = 1  # one micro-batch of 4 rows: F0 on 4 devices, one row each
  model = model_zoo_models.hf_gpt2(4 * n)
  step = tj.schedule(model.fn, mesh=jax.make_mesh((4,), ("pipe",)),
                     placement=tj.placements.mshape(4), num_microbatches=n,
                     cut="auto", solver_time_limit_s=10.0)
  got = step(model.params, model.batch)
  want = jax.jit(Z.reference(model, n, "train"))(model.params, model.batch)
  assert Z.result_err(got, want, "train", False) <= TOL
  assert step.built.kernels.modes[0].mode == "split"


def test_position_ids_of_the_batch_size_do_not_replicate():
  """Position ids (an iota along the sequence, looked up in a table) with
  sequence length == micro-batch rows: the lookup keeps the positions on the
  sequence axis, so the block splits its rows (HF GPT-2 at rows == seq)."""
  seq, hidden, n = 4, 8, 4
  params = _params(hidden)

  def fn(p, batch):
    x = batch["x"]                                     # (rows, seq, hidden)
    ids = jnp.broadcast_to(jnp.arange(seq)[None, :], x.shape[:2])
    h = jnp.tanh((x + p["pos"][ids]) @ p["w"][0])
    for i in range(1, 5):
      h = tj.boundary(h)
      h = jnp.tanh(h @ p["w"][i]) + h
    return jnp.mean((h.mean(1) - batch["y"]) ** 2)

  rng = np.random.default_rng(2)
  batch = {"x": jnp.asarray(rng.standard_normal((n * seq, seq, hidden)),
                            jnp.float32),
           "y": jnp.asarray(rng.standard_normal((n * seq, hidden)),
                            jnp.float32)}
  step = tj.schedule(fn, mesh=jax.make_mesh((4,), ("pipe",)),
                     placement=tj.placements.mshape(4), num_microbatches=n,
                     solver_time_limit_s=10.0)
  got = step(params, batch)
  assert M.max_rel_err(got, M.reference(fn, params, batch, n)) <= TOL
  assert step.built.kernels.modes[0].mode == "split"
