"""``experiments.prologue_cost_lib``: idle slot bytes per device, and the
extra prologue passes on one device (exactly zero: the step still equals
``jax.value_and_grad``; one ``conditional`` per changed fill)."""

from __future__ import annotations

import re

import jax
import jax.numpy as jnp
import numpy as np

import tessel_jax as tj
from experiments import prologue_cost_lib as lib
from tessel_jax import placements
from tessel_jax.passes import packing, zero_fill

import test_lowering_models as M

N = 4


def test_idle_slot_bytes_counts_the_other_devices_classes():
  avals = [jax.ShapeDtypeStruct((8, 8), np.float32)] * 2 + [
      jax.ShapeDtypeStruct((16, 16), np.float32)]
  layout = packing.make_layout(avals, {0: [0, 1], 1: [2]}, {0: [0], 1: [1]},
                               2, mode="slots")
  # Device 0 holds no (16, 16) leaf: one 1024-byte slot; device 1 none of
  # the two (8, 8) slots: 2 x 256 bytes.
  assert lib.idle_slot_bytes(layout) == (1024, 512)
  both = packing.make_layout(avals[:2], {0: [0], 1: [1]}, {0: [0], 1: [1]},
                             2, mode="slots")
  assert lib.idle_slot_bytes(both) == (0, 0)


def _two_widths():
  """``(loss, params, batch)``: device 0's 16x16 weights, device 1's
  64x64 (16 KiB each) and a 64x16 head."""
  keys = jax.random.split(jax.random.PRNGKey(0), 6)
  params = {"a": [jax.random.normal(k, (16, 16)) * 0.3 for k in keys[:2]],
            "up": jax.random.normal(keys[2], (16, 64)) * 0.3,
            "b": [jax.random.normal(k, (64, 64)) * 0.1 for k in keys[3:5]]}

  def loss(p, batch):
    x = batch["x"]
    for w in p["a"]:
      x = jnp.tanh(x @ w)
    x = tj.boundary(x) @ p["up"]
    for w in p["b"]:
      x = jnp.tanh(x @ w)
    return jnp.mean(x ** 2)

  return loss, params, {"x": jax.random.normal(keys[5], (N * 2, 16))}


def _shape(text: str) -> tuple[int, int]:
  """``(conditionals, while loops)`` in the entry computation."""
  entry = text[text.index("\nENTRY"):]
  entry = entry[:entry.index("\n}\n")]
  return (len(re.findall(r" conditional\(", entry)),
          len(re.findall(r" while\(", text)))


def test_extra_passes_exact_and_on_one_device_only():
  fn, params, batch = _two_widths()
  ref_loss, ref_grads = M.reference(fn, params, batch, N)
  mesh = jax.make_mesh((2,), ("pipe",), devices=jax.devices()[:2])
  counts = {}
  for dev in (None, 1):
    with lib.extra_passes(dev, passes=3, min_bytes=16 * 1024):
      step = tj.schedule(fn, mesh=mesh, placement=placements.vshape(2),
                         num_microbatches=N, cut="markers", cost="uniform",
                         param_layout="slots")
      loss, grads = step(params, batch)
      counts[dev] = _shape(step.lower(params, batch).compile().as_text())
    assert M.max_rel_err(loss, ref_loss) <= 1e-5, dev
    assert M.max_rel_err(grads, ref_grads) <= 1e-5, dev
  # Device 1's two 64x64 accumulators (16 KiB each) are filled under a
  # cond each (none merged), each with its loop of extra passes.
  assert counts[1][0] >= counts[None][0] + 2, counts
  assert counts[1][1] >= counts[None][1] + 2, counts
  with lib.extra_passes(0):
    patched = zero_fill.Fills.zeros
  assert zero_fill.Fills.zeros is not patched  # restored on exit
