"""Gradient unpacking moves each leaf alone, and a shared leaf is reduced once.

``passes.pack_arrays.unpack_grads`` runs outside the ``shard_map`` on the
per-device slot arrays ``(D, S, *shape)``; XLA turns every row it takes
from another device into a collective. Taking the slot first keeps each
transfer at one leaf (taking the device first moved its whole slot array,
``S`` leaves, once per leaf), and a leaf held in the same slot on every
device (a block on all devices) is summed by one reduction.
"""

import re

import jax
import numpy as np

import tessel_jax as tj
from experiments import lowering_bench_lib, peer_bench_lib, peer_gpipe
from tessel_jax import placements

_COLLECTIVE = re.compile(r"= f32\[([\d,]*)\][^=]*? (collective-permute|"
                         r"all-reduce|all-gather|all-to-all)\(")


def _outside(hlo: str) -> list[int]:
  """Element counts of the collectives outside the shard_map."""
  sizes = []
  for line in hlo.splitlines():
    m = _COLLECTIVE.search(line)
    if m and "shard_map" not in line:
      sizes.append(int(np.prod([int(x) for x in m.group(1).split(",") if x])))
  return sizes


def test_mshape_unpack_moves_one_leaf_at_a_time_and_matches_grad():
  hidden, n = 32, 4
  params = peer_gpipe.mlp_params(8, hidden)
  batch = lowering_bench_lib.make_batch(n * 8, hidden)
  mesh = jax.make_mesh((4,), ("pipe",), devices=jax.devices()[:4],
                       axis_types=(jax.sharding.AxisType.Auto,))
  step = tj.schedule(peer_bench_lib.marked_loss([4, 1, 1, 1, 1]), mesh=mesh,
                     placement=placements.mshape(4), num_microbatches=n,
                     cut="markers", cost="uniform")
  want = jax.value_and_grad(peer_gpipe.plain_loss(n))(params, batch)
  got = step(params, batch)
  for x, y in zip(jax.tree_util.tree_leaves(want),
                  jax.tree_util.tree_leaves(got)):
    np.testing.assert_allclose(np.asarray(x), np.asarray(y), rtol=1e-5,
                               atol=1e-6)
  built = step.build(params, batch)
  sizes = _outside(built.jitted.lower(params, batch).compile().as_text())
  assert sizes, "the gradients of 4 devices reach the output somehow"
  # One weight matrix at most per transfer (the slot array holds 5).
  assert max(sizes) <= hidden * hidden, sizes
