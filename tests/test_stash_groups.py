"""A kernel's stash values of one micro-batch side by side, written at once.

``passes.stash_groups.allocate`` lays the stores one kernel produces into
one pool on one device out interleaved (store ``r`` of ``R`` holds
micro-batch ``m`` at ``base + r + R * (m mod K)``), so the compact lowering
writes a kernel's residuals of a micro-batch with one
``dynamic-update-slice`` (``passes.local_writes``); the pools keep their
size. The programs stay equal to ``jax.value_and_grad``
(``tests/test_hlo_size.py``, ``tests/test_lowering*.py``).
"""

from __future__ import annotations

import re

import jax
import numpy as np
import pytest

import tessel_jax as tj
from experiments import lowering_bench_lib, peer_bench_lib, peer_gpipe
from tessel_jax import placements
from tessel_jax.passes import stash_groups
from tessel_jax.passes.plan_ir import Aval

import test_lowering_models as M

A = Aval((4, 8), "float32")
B = Aval((2, 8), "float32")


def _allocate():
  # Device 0: kernel 1 makes r0, r1, r2 (K = 2) and x (K = 1); kernel 2
  # makes y (K = 2). Device 1: kernel 3 makes z of another shape.
  keys = {("r0", 0): (A, 2, 1), ("r1", 0): (A, 2, 1), ("r2", 0): (A, 2, 1),
          ("x", 0): (A, 1, 1), ("y", 0): (A, 2, 2), ("z", 1): (B, 3, 3)}
  producer = {"r0": 1, "r1": 1, "r2": 1, "x": 1, "y": 2, "z": 3}
  return stash_groups.allocate(
      {k: v[0] for k, v in keys.items()}, {k: v[1] for k, v in keys.items()},
      {k: None for k in keys}, producer)


def _slot(store, m):
  return store.base + store.stride * (m % store.slots)


def test_one_kernels_stores_interleaved_per_microbatch():
  stores, pools = _allocate()
  group = [stores[(k, 0)] for k in ("r0", "r1", "r2")]
  for m in range(4):
    slots = [_slot(s, m) for s in group]
    assert slots == list(range(slots[0], slots[0] + 3))
  assert {s.stride for s in group} == {3}
  assert stores[("x", 0)].stride == 1 and stores[("y", 0)].stride == 1


def test_pools_keep_their_size_and_slots_stay_distinct():
  stores, pools = _allocate()
  # Pool of A on device 0: 3 * 2 + 1 + 2 slots, pool of B: 3.
  assert [p.slots for p in pools] == [9, 3]
  used = [(s.pool, s.device, _slot(s, m)) for s in stores.values()
          for m in range(s.slots)]
  assert len(used) == len(set(used))
  assert all(0 <= slot < pools[p].slots for p, _, slot in used)


@pytest.fixture(scope="module")
def compact_mlp():
  fn = peer_bench_lib.marked_loss([2, 2])
  params = peer_gpipe.mlp_params(4, 32, 0)
  batch = lowering_bench_lib.make_batch(4 * 8, 32, 1)
  mesh = jax.make_mesh((2,), ("pipe",), devices=jax.devices()[:2])
  step = tj.schedule(fn, mesh=mesh, placement=placements.vshape(2),
                     num_microbatches=4, cut="markers", interpret_ramps=0,
                     seed=0)
  return fn, params, batch, step


def test_compact_mlp_writes_each_kernels_residuals_at_once(compact_mlp):
  """vshape(2) MLP: F0 keeps 5 and F1 6 residuals of the stash's shape;
  each kernel's are one write (before: one per residual, 12 in all)."""
  fn, params, batch, step = compact_mlp
  built = step.build(params, batch)
  (pool,) = [p for p in built.plan.pools if p.slots > 1]
  shape = ",".join(str(s) for s in (pool.slots + 1,) + pool.aval.shape)
  text = step.lower(params, batch).compile().as_text()
  writes = re.findall(
      rf"= f32\[{shape}\]\{{[\d,]+\}} dynamic-update-slice\(", text)
  assert 1 <= len(writes) <= 4, len(writes)
  loss, grads = step(params, batch)
  ref_loss, ref_grads = M.reference(fn, params, batch, 4)
  assert M.max_rel_err(loss, ref_loss) <= 1e-5
  assert M.max_rel_err(grads, ref_grads) <= 1e-5
  np.testing.assert_array_equal(np.isfinite(float(loss)), True)
