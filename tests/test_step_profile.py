"""experiments.step_profile: HLO instructions to parts, self times."""

from __future__ import annotations

import pytest

from experiments import step_profile as sp

_HLO = """
ENTRY %main {
  %dot.2 = f32[4,4]{1,0} dot(%a, %b), metadata={op_name="jit(run)/shard_map/tj_kernel/dot_general"}
  %ppermute.21 = f32[4]{0} collective-permute(%x), channel_id=1, metadata={op_name="jit(run)/shard_map/tj_ppermute/ppermute"}
  %wrapped_add.6 = f32[16]{0} fusion(%g, %acc), kind=kLoop, metadata={op_name="jit(run)/shard_map/tj_accumulate/add"}
  %dynamic-update-slice.1 = f32[3,4]{1,0} dynamic-update-slice(%p, %v, %i), metadata={op_name="jit(run)/tj_stash_write/dynamic_update_slice"}
  %conditional.30 = (f32[4]{0}) conditional(%i, %t), branch_computations={%r1, %r2}
  %all-reduce.9 = f32[4]{0} all-reduce(%y), replica_groups={}
  %bitcast_pad_fusion.3 = f32[2,4]{1,0} fusion(%param.1), kind=kLoop, metadata={op_name="jit(run)/stack"}
  ROOT %tuple.1 = (f32[4]{0}) tuple(%z)
}
"""


def test_instructions_are_charged_to_their_scope():
  parts = sp.instruction_parts(_HLO)
  assert parts["dot.2"] == "kernels"
  assert parts["ppermute.21"] == "ppermute/rendezvous"
  assert parts["wrapped_add.6"] == "grad accumulation"
  assert parts["dynamic-update-slice.1"] == "stash"
  assert parts["conditional.30"] == "switch/loop"
  assert parts["all-reduce.9"] == "ppermute/rendezvous"
  assert parts["tuple.1"] == "other"
  assert parts["bitcast_pad_fusion.3"] == "pack/unpack"


def test_self_time_excludes_nested_instructions_per_thread():
  parts = {"conditional.30": "switch/loop", "dot.2": "kernels",
           "ppermute.21": "ppermute/rendezvous"}
  ev = [
      {"ph": "X", "name": "conditional.30", "ts": 0, "dur": 100, "tid": 1},
      {"ph": "X", "name": "dot.2", "ts": 10, "dur": 70, "tid": 1},
      # runtime events inside an instruction stay in its self time
      {"ph": "X", "name": "Rendezvous", "ts": 120, "dur": 30, "tid": 1},
      {"ph": "X", "name": "ppermute.21", "ts": 110, "dur": 50, "tid": 1},
      # another thread: its own stack
      {"ph": "X", "name": "dot.2", "ts": 5, "dur": 40, "tid": 2},
  ]
  got = sp.self_times(ev, parts)
  assert got["switch/loop"] == pytest.approx(30e-6)
  assert got["kernels"] == pytest.approx(110e-6)
  assert got["ppermute/rendezvous"] == pytest.approx(50e-6)
  assert got["stash"] == 0.0


def test_a_lowered_step_splits_into_its_parts():
  # pylint: disable=import-outside-toplevel
  import jax
  import tessel_jax as tj
  from experiments import lowering_bench_lib as lb
  from tessel_jax import placements
  mesh = jax.make_mesh((2,), ("pipe",),
                       axis_types=(jax.sharding.AxisType.Auto,),
                       devices=jax.devices()[:2])
  fn, params = lb.chain_model(2, 16, 1)
  batch = lb.make_batch(4 * 4, 16)
  step = tj.schedule(fn, mesh=mesh, placement=placements.vshape(2),
                     num_microbatches=4, plan="1f1b", cost="uniform")
  compiled = step.lower(params, batch).compile()
  row = sp.profile_step(lambda: compiled(params, batch), compiled.as_text(),
                        2, repeats=1)
  assert row["kernels"] > 0 and row["ppermute/rendezvous"] > 0
  assert row["stash"] > 0 and row["grad accumulation"] > 0
  busy = sum(row[p] for p in sp.PARTS)
  assert busy + row["idle"] >= row["wall_ms"] * 0.99
