"""Each device packs only its own parameter rows (``passes.pack_local``).

The per-device packing gives the arrays ``pack_arrays.pack`` gives (slots,
flat regions, pipe-sharded leaves), and the compiled program no longer
holds full-width copies of the slot arrays: packed in the global view, XLA
built every slot array as one zero-padded full-width copy per device row
(measured: 32 of 51 MiB per device on ``tp_bench``'s pipe4 row).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import AxisType

import tessel_jax as tj
from tessel_jax.passes import pack_arrays, pack_local, packing

from test_lowering_models import max_rel_err, reference


def _mesh(d: int) -> jax.sharding.Mesh:
  return jax.make_mesh((d,), ("pipe",), axis_types=(AxisType.Auto,),
                       devices=jax.devices()[:d])


def test_per_device_packing_equals_the_global_packing() -> None:
  d = 4
  rng = np.random.default_rng(0)
  avals = [jax.ShapeDtypeStruct((8, 16), jnp.float32) for _ in range(4)]
  avals += [jax.ShapeDtypeStruct((12,), jnp.float32),   # flat, odd shape
            jax.ShapeDtypeStruct((16, 4), jnp.float32)]  # pipe-sharded
  leaves = [jnp.asarray(rng.normal(size=a.shape), a.dtype) for a in avals]
  # Forward block i on device i reads layer leaf i; block 0 also the odd
  # leaf, every block the sharded leaf.
  block_params = {i: [i, 5] + ([4] if i == 0 else []) for i in range(d)}
  layout = packing.make_layout(avals, block_params,
                               {i: [i] for i in range(d)}, d,
                               shards={5: (0, d)})
  assert layout.classes and layout.dtypes  # both storage kinds in play
  want_flat, want_slots = pack_arrays.pack(layout, leaves)
  got_flat, got_slots = jax.jit(lambda ls: pack_local.pack(
      layout, ls, _mesh(d), "pipe", ()))(leaves)
  for dt in layout.dtypes:
    np.testing.assert_array_equal(got_flat[dt], want_flat[dt])
  for got, want in zip(got_slots, want_slots):
    for g, w in zip(got, want):
      np.testing.assert_array_equal(g, w)


def test_pipe4_program_holds_no_full_width_slot_copies() -> None:
  layers, h, f = 4, 64, 256

  def fn(params, batch):
    x = batch["x"]
    for i, p in enumerate(params):
      x = x + jax.nn.gelu(x @ p["up"]) @ p["down"]
      if i + 1 < layers:
        x = tj.boundary(x)
    return jnp.mean((x - batch["y"]) ** 2)

  keys = jax.random.split(jax.random.key(0), 2 * layers)
  params = [{"up": jax.random.normal(keys[2 * i], (h, f)) / 8,
             "down": jax.random.normal(keys[2 * i + 1], (f, h)) / 16}
            for i in range(layers)]
  batch = {"x": jnp.ones((8, h)), "y": jnp.zeros((8, h))}
  step = tj.schedule(fn, mesh=_mesh(4), placement=tj.placements.vshape(4),
                     num_microbatches=4, plan="1f1b")
  got = step(params, batch)
  assert max_rel_err(got, reference(fn, params, batch, 4)) < 1e-5
  temp = step.built.jitted.lower(params, batch).compile().memory_analysis(
  ).temp_size_in_bytes
  weights = sum(x.size * 4 for x in jax.tree.leaves(params))
  # Packed in the global view: one full-width copy of each slot array per
  # device row, 4x the weights per device (measured 2.10 MB for 0.52 MB of
  # weights). Per device: its slots, accumulators and gradients, the stash
  # (measured 0.53 MB).
  assert temp < 2 * weights, (temp, weights)
