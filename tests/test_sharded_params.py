"""Parameters sharded over a shared block's group (a vocab-sharded embedding).

A GPT-like model with a tied embedding ``wte`` sharded along the vocabulary
over the pipe axis: each device stores 1/4 of the table, blocks on all four
devices gather it at their tick, and the gradient comes back full-shaped and
equal to ``jax.value_and_grad``.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

import tessel_jax as tj

from test_lowering_models import max_rel_err, reference

VOCAB = 16
HIDDEN = 8
SEQ = 3
D = 4
TABLE_BYTES = VOCAB * HIDDEN * 4


def _params(num_layers: int, tied: bool = True) -> dict[str, Any]:
  keys = jax.random.split(jax.random.PRNGKey(0), num_layers + 2)
  p = {"wte": jax.random.normal(keys[0], (VOCAB, HIDDEN)) * 0.5,
       "layers": [{"w": jax.random.normal(k, (HIDDEN, HIDDEN)) * 0.4,
                   "b": jnp.full((HIDDEN,), 0.01 * i)}
                  for i, k in enumerate(keys[1:num_layers + 1])]}
  if not tied:
    p["wout"] = jax.random.normal(keys[-1], (VOCAB, HIDDEN)) * 0.5
  return p


def _batch(rows: int) -> dict[str, Any]:
  rng = np.random.default_rng(1)
  return {"tokens": jnp.asarray(rng.integers(0, VOCAB, (rows, SEQ)), jnp.int32),
          "labels": jnp.asarray(rng.integers(0, VOCAB, (rows, SEQ)), jnp.int32)}


def _layer(p: Any, h: Any) -> Any:
  return jnp.tanh(h @ p["w"] + p["b"]) + h


def _head(table: Any, h: Any, labels: Any) -> Any:
  logp = jax.nn.log_softmax(h @ table.T, axis=-1)
  return -jnp.mean(jnp.take_along_axis(logp, labels[..., None], axis=-1))


def gpt_fn(separate_head_block: bool, tied: bool = True):
  """embed | layer x4 (| head): the head joins the last layer unless
  ``separate_head_block`` (then it is its own block, mllm's all-device one).
  """

  def fn(params: Any, batch: Any) -> Any:
    h = tj.boundary(params["wte"][batch["tokens"]])
    for i, lp in enumerate(params["layers"]):
      h = _layer(lp, h)
      if i < len(params["layers"]) - 1 or separate_head_block:
        h = tj.boundary(h)
    table = params["wte"] if tied else params["wout"]
    return _head(table, h, batch["labels"])

  return fn


def _leaf(params: Any, name: str) -> int:
  """Flat index of top-level parameter ``name``."""
  paths = jax.tree_util.tree_flatten_with_path(params)[0]
  return next(q for q, (path, _) in enumerate(paths)
              if jax.tree_util.keystr(path) == f"['{name}']")


def _mesh() -> Any:
  return jax.make_mesh((D,), ("pipe",))


def _wte_bytes_per_device(layout: Any, leaf: int) -> tuple[int, ...]:
  """Bytes each device stores for leaf ``leaf`` (slots + flat regions)."""
  out = []
  for d in range(layout.num_devices):
    n = sum(c.nbytes for c in layout.classes for l in c.assign[d] if l == leaf)
    for dt in layout.dtypes:
      for region in layout.regions[dt].values():
        if region.offsets[d] >= 0:
          n += sum(s * np.dtype(dt).itemsize
                   for l, s in zip(region.leaves, region.sizes) if l == leaf)
    out.append(n)
  return tuple(out)


@pytest.mark.parametrize("placement,separate,n,ramps", [
    # tied: embedding and head blocks both on all devices; the compact
    # lowering (every tick interpreted but the collective ones)
    ("mllm", True, 4, "auto"),
    # long ramps interpreted + the repetend looped: collective ticks kept
    # unrolled in the ramps (the default lowering before "auto"; compiles
    # in a third of the CPU of 16 micro-batches under "auto", which checks
    # nothing the case above does not)
    ("mllm", True, 16, 2),
])
def test_tied_vocab_sharded_embedding_matches_value_and_grad(placement,
                                                             separate, n,
                                                             ramps):
  fn = gpt_fn(separate_head_block=separate)
  params, batch = _params(4), _batch(n * 8)
  spec = {"wte": P("pipe", None), "layers": None}
  step = tj.schedule(fn, mesh=_mesh(), placement=placement,
                     num_microbatches=n, param_sharding=spec,
                     interpret_ramps=ramps)
  loss, grads = step(params, batch)
  want_loss, want_grads = reference(fn, params, batch, n)
  assert jax.tree_util.tree_structure(grads) == jax.tree_util.tree_structure(
      want_grads)
  assert grads["wte"].shape == (VOCAB, HIDDEN)
  assert max_rel_err(loss, want_loss) <= 1e-5
  assert max_rel_err(grads, want_grads) <= 1e-5

  layout = step.built.layout
  wte = _leaf(params, "wte")
  assert layout.shards == {wte: (0, D)}
  # Each device stores only its quarter of the table (once: both blocks
  # that read it share one slot on every device).
  assert _wte_bytes_per_device(layout, wte) == (TABLE_BYTES // D,) * D
  plain = tj.schedule(fn, mesh=_mesh(), placement=placement,
                      num_microbatches=n)
  plain.lower(params, batch)
  full = plain.built.layout
  assert _wte_bytes_per_device(full, wte) == (TABLE_BYTES,) * D
  saved = np.array(full.bytes_per_device()) - np.array(
      layout.bytes_per_device())
  assert tuple(saved) == (TABLE_BYTES * (D - 1) // D,) * D
  # No tick running a block that gathers the table sits in an interp switch.
  plan = step.built.plan
  kinds = {seg.kind for seg in plan.segments}
  assert "interp" in kinds
  assert ("loop" in kinds) == (ramps != "auto"), kinds
  for seg in plan.segments:
    if seg.kind == "interp":
      for t in range(seg.start, seg.end):
        assert all(k is None or wte not in plan.kernels[k].params
                   for k in plan.ticks[t].kernels)


def test_mshape_untied_sharded_embedding_from_named_sharding():
  """mshape(4): F0 (all devices) reads the sharded table; the head's own
  table is on device 3. The sharding is read off the array itself."""
  fn = gpt_fn(separate_head_block=False, tied=False)
  n = 4
  # Auto axes, so the reference (plain value_and_grad) can index the table.
  mesh = jax.make_mesh((D,), ("pipe",),
                       axis_types=(jax.sharding.AxisType.Auto,))
  params, batch = _params(4, tied=False), _batch(n * 8)
  params["wte"] = jax.device_put(params["wte"],
                                 NamedSharding(mesh, P("pipe", None)))
  step = tj.schedule(fn, mesh=mesh, placement=tj.placements.mshape(D),
                     num_microbatches=n)
  loss, grads = step(params, batch)
  want_loss, want_grads = reference(fn, params, batch, n)
  assert max_rel_err(loss, want_loss) <= 1e-5
  assert max_rel_err(grads, want_grads) <= 1e-5
  wte = _leaf(params, "wte")
  assert step.built.layout.shards == {wte: (0, D)}
  assert _wte_bytes_per_device(step.built.layout, wte) == (
      TABLE_BYTES // D,) * D


@pytest.mark.parametrize("mode", ["train", "infer"])
def test_sharded_tied_table_read_by_a_subset_block(mode):
  """mshape(4) with a tied head: F0 (all devices) gathers the sharded table
  at its tick, the head block (device 3 only) reads it gathered onto its
  device before the first tick; its gradient is scattered back."""
  fn = gpt_fn(separate_head_block=False)
  n = 4
  params, batch = _params(4), _batch(n * 8)
  step = tj.schedule(fn, mesh=_mesh(), placement=tj.placements.mshape(D, mode),
                     num_microbatches=n, mode=mode,
                     param_sharding={"wte": P("pipe", None), "layers": None})
  got = step(params, batch)
  if mode == "train":
    loss, grads = got
    want_loss, want_grads = reference(fn, params, batch, n)
    assert max_rel_err(loss, want_loss) <= 1e-5
    assert max_rel_err(grads, want_grads) <= 1e-5
  else:
    want = jnp.stack([fn(params, jax.tree_util.tree_map(
        lambda x, m=m: x[m * 8:(m + 1) * 8], batch)) for m in range(n)])
    assert max_rel_err(got, want) <= 1e-5
  layout = step.built.layout
  wte = _leaf(params, "wte")
  head = [k for k in step.built.kernels.kernels.values()
          if k.kind == "F" and wte in k.params and len(k.devices) < D]
  assert len(head) == 1
  assert layout.gathered[wte].owners == head[0].devices
  # The layout stores a quarter per device (F0's region); the gathered full
  # table and its shard input are counted on every device.
  assert _wte_bytes_per_device(layout, wte) == (TABLE_BYTES // D,) * D
  plain = tj.schedule(fn, mesh=_mesh(), placement=tj.placements.mshape(D, mode),
                      num_microbatches=n, mode=mode)
  plain.lower(params, batch)
  extra = np.array(layout.bytes_per_device()) - np.array(
      plain.built.layout.bytes_per_device())
  assert tuple(extra) == (TABLE_BYTES * 2 // D,) * D


def test_bad_sharding_specs_raise():
  fn = gpt_fn(separate_head_block=True)
  params, batch = _params(4), _batch(32)
  bad_axis = tj.schedule(fn, mesh=_mesh(), placement="mllm",
                         num_microbatches=4,
                         param_sharding={"wte": P("pipe", "pipe"),
                                         "layers": None})
  with pytest.raises(tj.TesselError, match="one dimension"):
    bad_axis.lower(params, batch)
  params["wte"] = params["wte"][:VOCAB - 2]
  batch["tokens"] = batch["tokens"] % (VOCAB - 2)
  batch["labels"] = batch["labels"] % (VOCAB - 2)
  odd = tj.schedule(fn, mesh=_mesh(), placement="mllm", num_microbatches=4,
                    param_sharding={"wte": P("pipe", None), "layers": None})
  with pytest.raises(tj.TesselError, match="not divisible"):
    odd.lower(params, batch)
