"""A profile's kernels compiled as one program (``cost.grouped``, switch
``TESSEL_JAX_PROFILE_GROUPED``, on by default since session 43).

On: one compile for every kernel the profile measures (none through the
compile pool's one-kernel programs), each kernel run in its own branch and
priced net of the group's empty call; its flops as counted alone, its temp
bytes the group's. Off: no group compiled.
"""

from __future__ import annotations

import jax
import numpy as np
import pytest

from tessel_jax.cost import compile_pool, grouped, measure

import test_lowering_models as M


def _built():
  return M.uniform_chain_build(["embed", "layer", "layer", "head"],
                               [0, 0, 1, 1])


def _profile(monkeypatch, on: bool):
  """``(profile, memo, groups compiled, pool compiles)`` with the switch
  ``on`` or off (timing stubbed: 1 ms a call)."""
  built = _built()
  monkeypatch.setenv(grouped.ENV, "1" if on else "0")
  groups, pooled = [], []
  real_group, real_pool = grouped.compile_group, compile_pool.compile_pipelined

  def counted_group(kernels, *a, **k):
    groups.append(len(kernels))
    return real_group(kernels, *a, **k)

  def counted_pool(keys, lower, workers=None):
    pooled.append(len(keys))
    return real_pool(keys, lower, workers)
  monkeypatch.setattr(grouped, "compile_group", counted_group)
  monkeypatch.setattr(compile_pool, "compile_pipelined", counted_pool)
  monkeypatch.setattr(measure, "time_calls",
                      lambda fn, repeats, warmup, cpu_clock=False: (1e-3, 1))
  memo: dict = {}
  prof = measure.profile_kernels(
      built.kernels, built.graph, built.partition.traced.param_avals,
      jax.devices()[0], repeats=1, warmup=1, memo=memo,
      part=built.partition)
  return built, prof, memo, groups, pooled


def test_on_by_default_zero_turns_it_off():
  assert grouped.enabled({})
  assert grouped.enabled({grouped.ENV: "1"})
  assert not grouped.enabled({grouped.ENV: "0"})
  assert not grouped.enabled({grouped.ENV: ""})


def test_on_every_kernel_in_one_compile(monkeypatch):
  built, prof, memo, groups, pooled = _profile(monkeypatch, True)
  assert groups == [len(memo)] and len(memo) >= 4
  assert pooled == []
  assert prof.measured == len(memo)


def test_off_no_group(monkeypatch):
  _, prof, memo, groups, pooled = _profile(monkeypatch, False)
  assert groups == [] and sum(pooled) == len(memo)


def test_grouped_records_flops_and_temp(monkeypatch):
  built, prof, memo, _, _ = _profile(monkeypatch, True)
  avals = built.partition.traced.param_avals
  temps = {rec["temp_bytes"] for rec in memo.values()}
  assert len(temps) == 1 and temps.pop() > 0  # the group's, one figure
  for k in built.kernels.kernels.values():
    key = measure.kernel_key(k, avals, jax.devices()[0],
                             built.partition.blocks[k.fwd])
    alone = measure.lower_kernel(k, avals, jax.devices()[0]).flops
    # the kernel's own equations: not the branch's scalar read after the
    # barrier (counted, 3-12 flops more here); the alone figure also counts
    # its tick callable's flag test and branch (2 flops)
    assert alone - 2 <= memo[key]["flops"] <= alone, k.label


def test_member_priced_net_of_the_empty_call(monkeypatch):
  """The figure is the branch's time less the empty call's, timed alike."""
  built = _built()
  avals = built.partition.traced.param_avals
  kernels = list(built.kernels.kernels.values())[:2]
  group = grouped.compile_group(kernels, avals, jax.devices()[0],
                                [False, False])
  member = group[0].compiled

  def fake(fn, repeats, warmup, cpu_clock=False):
    return (1e-4 if fn == member.empty_call else 1e-3), 1
  monkeypatch.setattr(measure, "time_calls", fake)
  rec = measure.time_kernel(kernels[0], avals, jax.devices()[0],
                            prepared=group[0])
  assert rec["seconds"] == pytest.approx(9e-4)
  assert rec["raw_seconds"] == pytest.approx(1e-3)


def test_member_runs_its_kernel():
  """A branch's scalar is read from its kernel's outputs: the kernel ran
  (the empty call gives 0, a kernel on random inputs does not)."""
  built = _built()
  avals = built.partition.traced.param_avals
  kernels = [k for k in built.kernels.kernels.values() if k.kind == "F"][:2]
  group = grouped.compile_group(kernels, avals, jax.devices()[0],
                                [False, False])
  member = group[1].compiled
  assert float(member.empty_call()) == 0.0
  assert float(member(None, None)) != 0.0


def test_kernel_flops_stop_at_the_groups_barrier_not_the_kernels():
  """A kernel's own ``optimization_barrier`` (remat) is counted through;
  the group's scalar read after the last barrier is not."""
  def branch(x):
    y = jax.lax.optimization_barrier(x * 2.0)   # the kernel's own
    outs = jax.lax.optimization_barrier([y + 1.0])  # the group's
    return outs[0][0] * 3.0 + 1.0                  # the scalar read
  jaxpr = jax.make_jaxpr(branch)(np.zeros(8, np.float32))
  assert grouped._kernel_flops(jaxpr) == 16.0
