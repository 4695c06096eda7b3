"""``param_layout="auto"``: which parameter classes go to slots (issue 15).

Unevenly shaped models (ResNet18: every conv weight shape on one device of
a V-shape) put large leaves in classes that fill half their slots. Stored
flat, each such leaf is copied out at every kernel run and its share of the
flat accumulator copied at every tick (6.3-10x the CPU of slots, measured);
"auto" therefore keeps large leaves in slots up to half empty, small ones
(scales, biases) in the flat buffer.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from tessel_jax.passes import packing


def _aval(*shape: int) -> jax.ShapeDtypeStruct:
  return jax.ShapeDtypeStruct(shape, jnp.float32)


def _slot_leaves(layout: packing.Layout) -> set[int]:
  return {l for (l, _) in layout.slot_of}


def test_large_uneven_leaves_go_to_slots_small_ones_flat() -> None:
  # Device 0: two 3x3x64x64 convs and their biases; device 1: two
  # 3x3x128x128 convs and their biases (every class on one device of two).
  avals = [_aval(3, 3, 64, 64), _aval(3, 3, 64, 64), _aval(64), _aval(64),
           _aval(3, 3, 128, 128), _aval(3, 3, 128, 128), _aval(128),
           _aval(128)]
  layout = packing.make_layout(avals, {0: [0, 1, 2, 3], 1: [4, 5, 6, 7]},
                               {0: [0], 1: [1]}, 2)
  assert _slot_leaves(layout) == {0, 1, 4, 5}
  assert {l for r in layout.regions["float32"].values()
          for l in r.leaves} == {2, 3, 6, 7}
  flat = packing.make_layout(avals, {0: [0, 1, 2, 3], 1: [4, 5, 6, 7]},
                             {0: [0], 1: [1]}, 2, mode="flat")
  assert not flat.classes


def test_large_leaf_on_one_device_of_four_stays_flat() -> None:
  # Three quarters of its slots would be empty: 3x its bytes wasted.
  avals = [_aval(3, 3, 64, 64), _aval(8, 8), _aval(8, 8), _aval(8, 8),
           _aval(8, 8)]
  layout = packing.make_layout(avals, {0: [0, 1], 1: [2], 2: [3], 3: [4]},
                               {i: [i] for i in range(4)}, 4)
  assert _slot_leaves(layout) == {1, 2, 3, 4}   # balanced: slots
  assert 0 not in _slot_leaves(layout)


def test_small_leaves_half_empty_stay_flat() -> None:
  avals = [_aval(16, 16), _aval(32, 32)]   # 1 KiB and 4 KiB
  layout = packing.make_layout(avals, {0: [0], 1: [1]}, {0: [0], 1: [1]},
                               2)
  assert not layout.classes
