"""The tick plan's read tables, made once per kernel set (``passes.tick_tables``).

``build_plan`` remembers per plan what depends only on the kernels present
(ports, accumulators, message routes, the fixed part of a read port) and
fills in the micro-batch per tick. These tests check the tables against
their definition: a pool read of micro-batch ``m`` is slot
``base + stride * (m mod K)`` of its store on the devices that read it and
the pool's sink slot elsewhere; and an interpreted segment reads, for every
kernel input at every tick, the slot and row the unrolled tick reads.
"""

from __future__ import annotations

import jax

import tessel_jax as tj

from test_cost import _tiny

# A block on both devices (split rows) ahead of one block per device.
_PLACEMENT = [(0, 1), 0, 1]


def _plan(interpret_ramps):
  fn, params, batch = _tiny()
  step = tj.schedule(fn, mesh=jax.make_mesh((2,), ("pipe",)),
                     placement=tj.Placement(_PLACEMENT), num_microbatches=4,
                     interpret_ramps=interpret_ramps, cost="uniform")
  return step.build(params, batch).plan


def test_pool_reads_follow_the_store_slots():
  plan = _plan(None)
  checked = 0
  for t in plan.ticks:
    for kid in t.branches:
      if kid is None:
        continue
      k = plan.kernels[kid]
      for r, p in enumerate(t.in_map[kid]):
        port = t.reads[p]
        index = port.index.at(0)
        if port.kind != "pool":
          continue
        for d in range(plan.num_devices):
          if t.kernels[d] == kid:
            s = plan.stores[(k.inputs[r].key, d)]
            m = int(t.mb[d])
            assert index[d] == s.base + s.stride * (m % s.slots)
            checked += 1
          elif t.kernels[d] is None or p not in t.in_map[t.kernels[d]]:
            assert index[d] == plan.pools[port.source].slots   # sink
  assert checked > 10


def test_interp_reads_equal_the_unrolled_ticks():
  unrolled, compact = _plan(None), _plan(0)
  assert [s.kind for s in compact.segments] == ["interp"]
  spec = compact.interps[0]
  assert len(unrolled.ticks) == len(compact.ticks)
  split_reads = 0
  for tau, t in enumerate(unrolled.ticks):
    assert t.kernels == compact.ticks[tau].kernels
    for d, kid in enumerate(t.kernels):
      if kid is None:
        continue
      for r, p in enumerate(t.in_map[kid]):
        mine, theirs = spec.reads[spec.in_map[kid][r]], t.reads[p]
        assert mine.index.at(0)[tau, d] == theirs.index.at(0)[d]
        assert mine.row[tau, d] == theirs.row[d]
        assert mine.rowed or not theirs.rowed
        split_reads += bool(theirs.row[d] or (theirs.kind == "batch" and
                                              theirs.index.base[d]))
  # The split block's rows are read at an offset on the second device.
  assert split_reads > 0


def test_ticks_of_one_kernel_set_share_their_port_tables():
  plan = _plan(None)
  by_set = {}
  for t in plan.ticks:
    present = tuple(k for k in t.branches if k is not None)
    first = by_set.setdefault(present, t)
    assert first.in_map is t.in_map and first.out_map is t.out_map
    assert first.grad_map is t.grad_map
    assert [r.aval for r in first.reads] == [r.aval for r in t.reads]
  assert len(by_set) < len(plan.ticks)
