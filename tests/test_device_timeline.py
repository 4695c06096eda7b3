"""experiments.device_timeline: a traced step split per device although a
device's program moves between threads at its collectives."""

from __future__ import annotations

import pytest

from experiments import device_timeline as dt

_OP = 'metadata={op_name="jit(run)/shard_map/%s"}'
_HLO = "\n".join([
    "ENTRY %main {",
    f"  %fwd.1 = f32[4]{{0}} fusion(%a), kind=kLoop, {_OP % 'tj_kernel/k0/dot'}",
    f"  %bwd.2 = f32[4]{{0}} fusion(%a), kind=kLoop, {_OP % 'tj_kernel/k1/dot'}",
    f"  %add.3 = f32[4]{{0}} fusion(%g), kind=kLoop, {_OP % 'tj_accumulate/add'}",
    "  %ppermute.4 = f32[4]{0} collective-permute(%x), channel_id=1, "
    + _OP % "tj_ppermute/ppermute",
    "}"])
# Kernel 0 runs on device 0, kernel 1 on device 1.
_DEVICES = {0: (0,), 1: (1,)}


def _ev(name, ts, dur, tid):
  return {"ph": "X", "name": name, "ts": ts, "dur": dur, "tid": tid}


def _hopping_step():
  """Two threads; after the collective at 10-12 us each runs the other
  device's program (thread 1: device 0 then 1; thread 2: 1 then 0), and
  thread 2 ends with a kernel-less run (an accumulation) of device 0."""
  return [
      _ev("fwd.1", 0, 10, 1), _ev("ppermute.4", 10, 2, 1),
      _ev("bwd.2", 12, 8, 1), _ev("add.3", 20, 5, 1),
      _ev("bwd.2", 0, 8, 2), _ev("add.3", 8, 2, 2),
      _ev("ppermute.4", 10, 2, 2),
      _ev("fwd.1", 12, 6, 2), _ev("ppermute.4", 18, 1, 2),
      _ev("add.3", 19, 3, 2),
      {"ph": "X", "name": "Rendezvous", "ts": 10, "dur": 1, "tid": 2},
  ]


def test_each_run_is_charged_to_the_device_its_kernels_name():
  got = dt.per_device(_hopping_step(), _HLO, _DEVICES, 2)
  d0, d1 = got["devices"]
  assert d0["k0"] == pytest.approx(16e-3)
  assert "k1" not in d0
  assert d1["k1"] == pytest.approx(16e-3)
  assert "k0" not in d1
  # Device 1's accumulation: 2 us on thread 2, 5 us on thread 1.
  assert d1["grad accumulation"] == pytest.approx(7e-3)
  # The kernel-less run at 19-22 us overlaps device 1's run on thread 1.
  assert d0["grad accumulation"] == pytest.approx(3e-3)
  assert d0["ppermute/rendezvous"] == pytest.approx(3e-3)
  assert got["unassigned_ms"] == 0.0
  # Device 0: runs ending at 10 us, 18 us, and its last run; device 1:
  # the run up to 10 us and the one from 12 us.
  assert len(got["intervals"][0]) == 3
  assert len(got["intervals"][1]) == 2


def test_overlap_counts_only_time_two_threads_compute_at_once():
  got = dt.busy_overlap(_hopping_step(), _HLO)
  # Thread 1 busy 0-10 and 12-25, thread 2 0-10, 12-18 and 19-22:
  # both at 0-10, 12-18 and 19-22.
  assert got["span_ms"] == pytest.approx(25e-3)
  assert got["overlap_ms"] == pytest.approx(19e-3)
  assert got["busy_ms"] == pytest.approx(42e-3)
