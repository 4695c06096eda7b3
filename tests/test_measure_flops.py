"""A profiled kernel's flops counted on the jaxpr its lowering traced
(``cost.measure._lowered_and_flops``), not by XLA's cost analysis.

The cost analysis converted and analysed each kernel's lowered program once
more (20-45 ms a kernel on the README GPT); the count on the traced jaxpr
is what the estimates of unmeasured kernels use (``cost.estimate``), within
0.5% of XLA's on the transformer kernels. ``TESSEL_JAX_PROFILE_FLOPS=xla``
keeps the old path.
"""

from __future__ import annotations

import jax
import pytest

from tessel_jax.cost import flops as cost_flops
from tessel_jax.cost import grouped, measure

import test_lowering_models as M


def _built():
  return M.uniform_chain_build(["embed", "layer", "head"], [0, 0, 1])


def _lowered_flops(monkeypatch, path: str) -> tuple[dict[str, float], int]:
  """Flops of every kernel's lowering on ``path`` ("" or "xla") and how
  many cost analyses ran."""
  built = _built()
  avals = built.partition.traced.param_avals
  analysed = []
  real = cost_flops.analysed_flops

  def counted(lowered):
    analysed.append(1)
    return real(lowered)
  monkeypatch.setattr(measure, "analysed_flops", counted)
  monkeypatch.setenv(measure.FLOPS_ENV, path)
  out = {}
  for k in built.kernels.kernels.values():
    low = measure.lower_kernel(k, avals, jax.devices()[0])
    out[k.label] = low.flops
  return out, len(analysed)


def test_profile_runs_no_cost_analysis(monkeypatch):
  flops, analyses = _lowered_flops(monkeypatch, "")
  assert analyses == 0
  assert all(f is not None and f > 0 for f in flops.values())


def test_counted_flops_agree_with_xla(monkeypatch):
  counted, _ = _lowered_flops(monkeypatch, "")
  xla, analyses = _lowered_flops(monkeypatch, "xla")
  assert analyses == len(xla)
  for label, f in xla.items():
    if f > 1e4:  # tiny kernels: XLA counts a gather's work differently
      assert counted[label] == pytest.approx(f, rel=0.02), label


def test_records_carry_the_counted_flops(monkeypatch):
  """What the estimator calibrates on (``rec["flops"]``) is the count of
  the kernel's lowering, with no cost analysis on the profile's path."""
  built = _built()
  avals = built.partition.traced.param_avals
  monkeypatch.setenv(grouped.ENV, "0")  # each kernel its own lowering
  monkeypatch.setattr(measure, "time_calls",
                      lambda fn, repeats, warmup, cpu_clock=False: (1e-3, 1))
  monkeypatch.setattr(measure, "analysed_flops", _fail)
  memo: dict = {}
  measure.profile_kernels(built.kernels, built.graph, avals,
                          jax.devices()[0], repeats=1, warmup=1, memo=memo,
                          part=built.partition)
  for k in built.kernels.kernels.values():
    low = measure.lower_kernel(k, avals, jax.devices()[0])
    key = measure.kernel_key(k, avals, jax.devices()[0],
                             built.partition.blocks[k.fwd])
    assert memo[key]["flops"] == pytest.approx(low.flops), k.label


def _fail(lowered):
  raise AssertionError("cost analysis on the profile's path")
