"""conftest.shared_tick_costs: the tick microbenchmark once per mesh."""

from __future__ import annotations

import jax
import pytest

import conftest
from tessel_jax.cost import ticks


@pytest.fixture
def counted(monkeypatch):
  """A stand-in for the microbenchmark counting its calls (installed before
  ``shared_tick_costs`` wraps it), and an empty memo."""
  calls = []

  def fake(mesh, axis="pipe", **kw):
    calls.append((mesh.devices.size, axis, kw))
    return ticks.TickCosts(fixed_s=1e-6 * len(calls), per_byte_s=0.0)

  monkeypatch.setattr(ticks, "measure_tick_costs", fake)
  monkeypatch.setattr(conftest, "_TICK_COSTS", {})
  return calls


def test_each_mesh_and_axis_is_measured_once(counted, shared_tick_costs):
  del shared_tick_costs
  two = jax.make_mesh((2,), ("pipe",), devices=jax.devices()[:2])
  four = jax.make_mesh((4,), ("pipe",), devices=jax.devices()[:4])
  first = ticks.measure_tick_costs(two, "pipe")
  assert ticks.measure_tick_costs(two, "pipe") is first
  assert ticks.measure_tick_costs(four, "pipe") is not first
  assert ticks.measure_tick_costs(two, "pipe", ticks=8) is not first
  assert ticks.measure_tick_costs(four) == ticks.measure_tick_costs(four)
  assert len(counted) == 3
