"""experiments.lowering_bench_floors: the sync floor between rendezvous."""

from __future__ import annotations

import types

import numpy as np
import pytest

from experiments import lowering_bench_floors as floors_mod
from tessel_jax.passes.segments import Segment

NS = types.SimpleNamespace


def _tick(kernels, sends=()):
  return NS(kernels=kernels, sends=tuple(sends))


def _interp_plan(kernels, flush_after):
  """One interpreted segment; its remote round flushes after the ticks
  in ``flush_after``."""
  flush = np.zeros((len(kernels) + 1, 2), np.int64)
  for t in flush_after:
    flush[t + 1] = 1
  spec = NS(sends=(NS(remote=True, flush=flush),
                   NS(remote=False, flush=None)))
  return NS(ticks=[_tick(k) for k in kernels],
            segments=(Segment(0, len(kernels), 1, "interp"),),
            interps={0: spec}, num_devices=2)


def test_devices_run_freely_between_rendezvous():
  # [F0 | -], [B0 | F1], [- | B1], [F0 | -]: flush after ticks 0 and 3.
  plan = _interp_plan([(0, None), (3, 1), (None, 2), (0, None)], (0, 3))
  kernel_s = {0: 0.020, 3: 0.030, 1: 0.010, 2: 0.040}
  got = floors_mod.floors(plan, kernel_s)
  assert floors_mod.sync_after(plan) == [0, 3]
  assert got["in_program_kernel_ms_by_device"] == [50.0, 50.0]
  # per tick: 10 + 30 + 40 + 10
  assert got["lockstep_ms"] == pytest.approx(90.0)
  # tick 0: 10; ticks 1-3: max(30 + 10, 10 + 40) = 50
  assert got["sync_floor_ms"] == pytest.approx(60.0)
  assert got["rendezvous"] == 2


def test_a_rendezvous_after_every_tick_is_the_lockstep_floor():
  kernels = [(0, None), (3, 1), (None, 2)]
  plan = _interp_plan(kernels, (0, 1, 2))
  got = floors_mod.floors(plan, {0: 0.01, 3: 0.03, 1: 0.02, 2: 0.04})
  assert got["sync_floor_ms"] == pytest.approx(got["lockstep_ms"])


def test_straight_runs_sync_where_held_rounds_are_written():
  # Tick 0's remote round is first read at tick 2: one rendezvous, before
  # tick 2 (after tick 1); nothing is pending at the end.
  rd = NS(remote=True, due=2)
  ticks = [_tick((0, None), [rd]), _tick((3, 1)), _tick((None, 2))]
  plan = NS(ticks=ticks, segments=(Segment(0, 3, 1, "ticks"),), interps={},
            num_devices=2)
  assert floors_mod.sync_after(plan) == [1]
  got = floors_mod.floors(plan, {0: 0.01, 3: 0.03, 1: 0.02, 2: 0.04})
  # ticks 0-1: max(10 + 30, 20) = 40; tick 2: 40
  assert got["sync_floor_ms"] == pytest.approx(80.0)


_HLO = """\
%fused_add (p: f32[4]) -> f32[4] {
  %add.9 = f32[4]{0} add(%p, %p), metadata={op_name="x/tj_kernel/k2/add"}
}

%branch_b1 (a: f32[4]) -> f32[4] {
  %conv.1 = f32[4]{0} fusion(%a), kind=kLoop, calls=%fused_add, metadata={op_name="jit(run)/shard_map/tj_kernel/k2/conv"}
  %read.1 = f32[4]{0} dynamic-slice(%a), metadata={op_name="jit(run)/shard_map/tj_stash_read/ds"}
  ROOT %acc.1 = f32[4]{0} add(%conv.1, %read.1), metadata={op_name="jit(run)/shard_map/tj_accumulate/add"}
}

%branch_f0 (a: f32[4]) -> f32[4] {
  ROOT %dot.1 = f32[4]{0} multiply(%a, %a), metadata={op_name="jit(run)/shard_map/tj_kernel/k0/mul"}
}

ENTRY %main (a: f32[4]) -> f32[4] {
  %pp.1 = f32[4]{0} collective-permute(%a), metadata={op_name="jit(run)/shard_map/tj_ppermute/pp"}
  ROOT %w.1 = f32[4]{0} add(%pp.1, %a), metadata={op_name="jit(run)/shard_map/tj_accumulate/add"}
}
"""


def _event(name, ts, dur, tid=1):
  return {"ph": "X", "name": name, "ts": ts, "dur": dur, "tid": tid}


def test_a_kernels_branch_charges_its_reads_and_accumulation_to_it():
  owner = floors_mod.instruction_kernels(_HLO)
  assert owner == {"conv.1": 2, "read.1": 2, "acc.1": 2, "dot.1": 0}
  events = [_event("conv.1", 0, 4000), _event("read.1", 4000, 1000),
            _event("acc.1", 5000, 2000), _event("dot.1", 0, 3000, tid=2),
            _event("w.1", 9000, 5000)]
  parts = floors_mod.kernel_parts(events, _HLO)
  assert parts[2] == pytest.approx(
      {"kernels": 0.004, "stash": 0.001, "grad accumulation": 0.002})
  assert parts[0] == pytest.approx({"kernels": 0.003})
  plan = _interp_plan([(0, 2), (0, 2)], (0, 1))
  plan.kernels = {0: NS(devices=(0,)), 2: NS(devices=(1,))}
  got = floors_mod.inclusive_floors(plan, parts)
  assert got["inclusive_in_program_kernel_ms_by_device"] == [3.0, 7.0]
  assert got["inclusive_sync_floor_ms"] == pytest.approx(7.0)
  assert got["parts_ms_by_device"][1]["grad accumulation"] == 2.0
