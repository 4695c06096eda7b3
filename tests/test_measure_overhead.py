"""A kernel's profile leaves out what its call costs (``cost.measure``).

Inside the pipelined program a kernel is inlined: no call, and its inputs
and outputs are stash slots, not arrays. Timed alone, each call also pays
per input and output array; ``call_timing.call_overhead`` measures that once
per process and ``time_kernel`` takes it off.
"""

from __future__ import annotations

import jax

from tessel_jax.cost import call_timing, kernel_keys, measure

import test_lowering_models as M


def _kernels():
  built = M.uniform_chain_build(["embed", "layer", "head"], [0, 0, 1])
  return built.kernels.kernels, built.partition.traced.param_avals


def test_call_overhead_prices_each_further_array():
  over = call_timing.CallOverhead(empty_s=5e-6, per_input_s=0.5e-6,
                              per_output_s=1e-6)
  assert over.seconds(1, 1) == 5e-6
  assert over.seconds(0, 0) == 5e-6
  assert abs(over.seconds(11, 21) - (5e-6 + 10 * 0.5e-6 + 20 * 1e-6)) < 1e-12


def test_kernel_time_takes_off_the_overhead_of_its_arrays(monkeypatch):
  kernels, avals = _kernels()
  dev = jax.devices()[0]
  over = call_timing.CallOverhead(empty_s=4e-6, per_input_s=1e-6,
                              per_output_s=2e-6)
  cores = 1 if call_timing.cpu_cores() else None
  monkeypatch.setitem(call_timing._OVERHEAD,  # pylint: disable=protected-access
                      (dev.platform, dev.id, cores, None), over)
  monkeypatch.setattr(measure, "time_calls",
                      lambda fn, repeats, warmup, cpu_clock=False: (1e-3, 1))
  seen = set()
  for k in kernels.values():
    rec = measure.time_kernel(k, avals, dev, rounds=1)
    inputs = len(k.params) + len(k.in_avals) + 1  # + the branch flag
    outputs = len(k.out_avals) + len(k.grads)
    seen.add((inputs, outputs))
    assert rec["raw_seconds"] == 1e-3
    assert abs(rec["seconds"] - (1e-3 - over.seconds(inputs, outputs))) < 1e-12
  assert len(seen) > 1           # kernels with different array counts


def test_profile_version_joins_the_kernel_key(monkeypatch):
  kernels, avals = _kernels()
  k = next(iter(kernels.values()))
  dev = jax.devices()[0]
  before = measure.kernel_key(k, avals, dev)
  monkeypatch.setattr(kernel_keys, "PROFILE_VERSION",
                      kernel_keys.PROFILE_VERSION + 1)
  assert measure.kernel_key(k, avals, dev) != before
