"""experiments.placed_bench's kernel floors and experiments.host_pages."""

from __future__ import annotations

import types

import jax.numpy as jnp
import pytest

from experiments import host_pages
from experiments import placed_bench


def _ticks(*kernels):
  return [types.SimpleNamespace(kernels=k) for k in kernels]


def test_lockstep_floor_charges_each_tick_its_slowest_kernel():
  # device 0 runs kernel 0 (2 calls, 10 ms each) and 3 (1 call, 30 ms);
  # device 1 runs kernel 1 (2 calls, 20 ms each).
  ticks = _ticks((0, None), (3, 1), (0, 1))
  got = placed_bench.tick_bound_ms(ticks, 2, {0: 0.020, 1: 0.040, 3: 0.030})
  assert got["in_program_kernel_ms_by_device"] == [50.0, 40.0]
  assert got["in_program_busiest_ms"] == 50.0
  assert got["lockstep_ms"] == 10.0 + 30.0 + 20.0


def test_a_kernel_on_two_devices_is_charged_per_call():
  ticks = _ticks((2, 2), (0, None))
  got = placed_bench.tick_bound_ms(ticks, 2, {2: 0.010, 0: 0.004})
  assert got["in_program_kernel_ms_by_device"] == [9.0, 5.0]
  assert got["lockstep_ms"] == pytest.approx(9.0)


def test_keep_pages_sets_the_tunables_and_keeps_others():
  env = host_pages.env(True, {"GLIBC_TUNABLES": "glibc.x=1", "A": "b"})
  assert env["GLIBC_TUNABLES"] == "glibc.x=1:" + host_pages.KEEP_PAGES
  assert env["A"] == "b"
  assert "GLIBC_TUNABLES" not in host_pages.env(False, {"A": "b"})
  assert "glibc.malloc.mmap_max=0" in host_pages.KEEP_PAGES


def test_the_table_puts_the_step_against_each_floor():
  row = {"in_program_busiest_ms": 100.0, "lockstep_ms": 130.0,
         "sync_floor_ms": 105.0, "rendezvous": 9,
         "tessel_placed": {"wall_ms": 150.0, "sys_ms": 28.0,
                           "minor_faults": 13713}}
  busiest, lock, sync, ratios, faults = placed_bench._bound_cells(row)  # pylint: disable=protected-access
  assert (busiest, lock) == ("100", "130")
  assert sync == "105 (9 rendezvous)"
  assert ratios == "1.50x, 1.15x, 1.43x"
  assert faults == "28.0, 13713"


def test_shuffled_rounds_runs_each_once_per_round():
  calls = []
  runs = {k: (lambda k=k: calls.append(k) or jnp.zeros(())) for k in "abc"}
  times, loads = placed_bench.shuffled_rounds(runs, 4)
  assert sorted(calls) == sorted("abc" * 4)
  for r in range(4):  # every round holds each run exactly once
    assert sorted(calls[3 * r:3 * r + 3]) == ["a", "b", "c"]
  assert {k: len(v) for k, v in times.items()} == {"a": 4, "b": 4, "c": 4}
  assert all(len(t) == 4 and t[0] >= 0 for ts in times.values() for t in ts)
  assert len(loads) == 4
