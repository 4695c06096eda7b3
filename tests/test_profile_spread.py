"""``experiments.profile_spread``: a model's kernels re-profiled from
scratch in one process, the spread of their sum."""

from __future__ import annotations

import jax
import pytest

import tessel_jax as tj
from experiments import profile_spread_lib as lib
from tessel_jax.cost import call_timing

import test_lowering_models as M


def _step(cost: str):
  mesh = jax.make_mesh((2,), ("pipe",))
  kinds = ["embed", "layer", "head"]
  step = tj.schedule(M.chain_fn(kinds), mesh=mesh,
                     placement=tj.Placement([0, 0, 1]), num_microbatches=4,
                     cost=cost)
  return step, M.make_params(M.num_layers(kinds)), M.make_batch(16)


def test_spread_figures():
  s = lib.spread([1.0, 2.0, 3.0])
  assert s["median"] == 2.0 and s["min"] == 1.0 and s["max"] == 3.0
  assert abs(s["cv"] - (2 / 3) ** 0.5 / 2) < 1e-12
  assert lib.spread([2.0, 2.0])["cv"] == 0.0


def test_a_build_without_profile_is_refused():
  """(A ``cost="uniform"`` build profiles nothing, as this callable.)"""
  with pytest.raises(ValueError, match="cost='measured'"):
    lib.captured_inputs(lambda: None)


def test_each_profile_from_scratch(monkeypatch):
  """The inputs of the build's profile captured; a re-profile measures
  every kernel (nothing from the build's memo); with fresh_overhead the
  call overhead is measured again before it."""
  step, params, batch = _step("uniform")
  built = step.build(params, batch)
  avals = built.partition.traced.param_avals
  inputs = lib.captured_inputs(lambda: lib.measure.profile_kernels(
      built.kernels, built.graph, avals, jax.devices()[0], memo={},
      part=built.partition, repeats=1))
  assert inputs.ks is built.kernels and inputs.repeats == 1
  timed: list[int] = []
  real = call_timing.time_calls
  monkeypatch.setattr(
      lib.measure, "time_calls",
      lambda fn, repeats, warmup, cpu_clock=False:
      timed.append(1) or real(fn, 1, 1, cpu_clock))
  cleared: list[int] = []
  monkeypatch.setattr(call_timing, "_OVERHEAD",
                      type("Spy", (dict,), {"clear": lambda self:
                                            cleared.append(1)})())
  row = lib.spread_of(inputs, builds=1, fresh_overhead=True)
  assert row["kernels"] == len(inputs.ks.kernels) and len(row["sums_ms"]) == 1
  assert all(x > 0 for x in row["sums_ms"]) and row["cv"] >= 0
  assert all(o > 0 for o in row["overhead_ms"])
  assert len(timed) >= len(set(lib.measure.kernel_key(
      k, inputs.param_avals, inputs.device,
      inputs.part.blocks[k.fwd]) for k in inputs.ks.kernels.values()))
  assert cleared == [1]


def test_paired_spread_alternates_the_pricings(monkeypatch):
  """``--fused_pairs``: each build profiles with ``cost.fused_grads`` off
  and on, the order alternating, and each pricing gets its own spread and
  kernel medians (synthetic profiles: nothing timed)."""
  from tessel_jax.cost import fused_grads  # pylint: disable=import-outside-toplevel
  monkeypatch.delenv(fused_grads.ENV, raising=False)
  seen: list[bool] = []

  def fake(inputs, fresh_overhead):
    on = fused_grads.enabled()
    seen.append(on)
    return {"sum_ms": 2.0 if on else 3.0, "overhead_ms": 0.1, "cpu_s": 1.0,
            "kernel_ms": {"B0": 1.0 if on else 1.5}}

  monkeypatch.setattr(lib, "profile_once", fake)
  inputs = lib.ProfileInputs(type("KS", (), {"kernels": {0: None}})(), None,
                             [], None)
  row = lib.paired_spread(inputs, 3, False)
  assert seen == [False, True, True, False, False, True]
  assert row["old"]["median_ms"] == 3.0 and row["fused"]["median_ms"] == 2.0
  assert row["old"]["kernel_ms"] == {"B0": 1.5}
  assert row["fused"]["kernel_ms"] == {"B0": 1.0}
  assert not fused_grads.enabled()
