"""Gradient unpacking moves each leaf once, and a shared leaf is reduced once.

``passes.pack_arrays.unpack_grads`` runs outside the ``shard_map`` on the
per-device slot arrays ``(D, S, *shape)``; XLA turns every row it takes
from another device into a collective. Taking the slot first keeps each
transfer at one leaf (taking the device first moved its whole slot array,
``S`` leaves, once per leaf), and a leaf held in the same slot on every
device (a block on all devices) is summed by one reduction. A slot that
holds a distinct leaf on every device (mshape's own blocks) is gathered
whole, one ``all-gather`` of that slot's column, not one
``collective-permute`` per device into a shared all-reduce.
"""

import re

import jax
import numpy as np

import tessel_jax as tj
from experiments import lowering_bench_lib, peer_bench_lib, peer_gpipe
from tessel_jax import placements

_COLLECTIVE = re.compile(r"= (\(?f32\[.*?) (collective-permute|all-reduce|"
                         r"all-gather|all-to-all)\(")
_SHAPE = re.compile(r"f32\[([\d,]*)\]")


def _outside_ops(hlo: str) -> list[tuple[str, int]]:
  """``(op, element count)`` of the collectives outside the shard_map.

  Ops inside the shard_map's body name it in their metadata
  (``.../shard_map/...``); the ones outside name it last or not at all.
  A combined collective (a tuple result: XLA's combiners in jax >= 0.11)
  counts once per element, each a leaf of its own.
  """
  out = []
  for line in hlo.splitlines():
    m = _COLLECTIVE.search(line)
    if m and "shard_map/" not in line:
      for dims in _SHAPE.findall(m.group(1)):
        out.append((m.group(2),
                    int(np.prod([int(x) for x in dims.split(",") if x]))))
  return out


def _outside(hlo: str) -> list[int]:
  """Element counts of the collectives outside the shard_map."""
  return [n for _, n in _outside_ops(hlo)]


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
  ops = _outside_ops(built.jitted.lower(params, batch).compile().as_text())
  sizes = [n for _, n in ops]
  assert sizes, "the gradients of 4 devices reach the output somehow"
  # One weight matrix per device at most per transfer (the slot array
  # holds 5 per device).
  assert max(sizes) <= 4 * hidden * hidden, sizes
  # The own blocks' weights (slot 4, a distinct leaf per device): one
  # all-gather of the column, no weight-sized permute to one device.
  assert ("all-gather", 4 * hidden * hidden) in ops, ops
  assert not [n for op, n in ops
              if op == "collective-permute" and n >= hidden * hidden], ops
