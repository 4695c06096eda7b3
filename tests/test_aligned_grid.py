"""The coarse candidate on the grid of one step per typical kernel
(``quantize.aligned``, the ``aligned_grid`` switch of
``step_schedule.coarse_candidate``). Pure Python: no jax, no timing."""

from __future__ import annotations

import types

from passes import switches as switches_lib
from passes.switches import Switches
from tessel_jax import placements, step_schedule
from tessel_jax.cost import quantize

# peer_bench's 4-stage zbv, its kernels measured at load ~10 (ms per
# micro-batch): F, B and W all ~10 ms, B0 (no input gradient) 0.2 ms.
ZBV_MS = {"F0": 10.63, "F7": 10.06, "B7": 9.44, "B0": 0.22, "W7": 9.28}
ZBV_KIND_MS = {"F": 11.24, "B": 10.04, "W": 10.95}
# peer_bench's 4-stage mshape beside two busy processes
# (tests/test_coarse_candidate.py).
MSHAPE_MS = {"F0": 10.68, "F1": 8.32, "F2": 8.32, "F3": 8.32, "F4": 8.63,
             "B4": 15.99, "B3": 17.58, "B2": 17.58, "B1": 17.58,
             "B0": 18.66}


def _zbv() -> quantize.Quantized:
  graph = placements.zbv(4)
  seconds = {b.id: 1e-3 * ZBV_MS.get(b.label, ZBV_KIND_MS[b.kind])
             for b in graph.blocks}
  return quantize.quantize(graph, seconds)


def _mshape() -> quantize.Quantized:
  # With memory: a block shorter than half a step is left out of the
  # error, not out of a (then invalid) graph.
  graph = placements.mshape(4)
  return quantize.quantize(
      graph, {b.id: 1e-3 * MSHAPE_MS[b.label] for b in graph.blocks},
      {b.id: (1000 if b.kind == "F" else -1000) for b in graph.blocks})


def test_equal_kernels_get_equal_spans_on_the_aligned_grid():
  q = _zbv()
  # The default grid: 24 steps (none within 5%: B0's one-step floor),
  # kernels of ~10 ms at 3 or 4 steps.
  assert sorted({b.span for b in q.graph.blocks}) == [1, 3, 4]
  assert len({b.span for b in quantize.coarser(q).blocks}) > 1
  graph = quantize.aligned(q)
  assert [b.span for b in graph.blocks] == [1] * len(graph.blocks)
  assert [(b.id, b.devices, b.memory) for b in graph.blocks] == [
      (b.id, b.devices, b.memory) for b in q.graph.blocks]


def test_no_aligned_grid_where_it_rounds_kernels_badly():
  # mshape: B ~2x F; one step per typical kernel would make them equal.
  assert quantize.aligned(_mshape()) is None
  # Spans that are already one step each.
  graph = placements.vshape(2)
  q = quantize.quantize(graph, {0: 1e-3, 1: 1e-3, 2: 1e-3, 3: 1e-3})
  assert quantize.aligned(q) is None


def _searched(monkeypatch, q, switches):
  got = []

  def find(step, graph, *a, **k):
    got.append(graph)
    return "sched", "unrolled"
  monkeypatch.setattr(step_schedule, "find_schedule", find)
  step = types.SimpleNamespace(
      _costs=types.SimpleNamespace(time_resolution=None),
      cheap_screening=False, switches=switches, solver_time_limit_s=30.0)
  res = step_schedule.coarse_candidate(
      step, types.SimpleNamespace(quantized=q), 1, None, 8)
  assert res[1:] == ("sched", "unrolled")
  return [b.span for b in got[0].blocks]


def test_the_switch_searches_the_aligned_grid_else_the_coarser(monkeypatch):
  q = _zbv()
  on = _searched(monkeypatch, q, Switches(aligned_grid=True))
  assert on == [1] * len(q.graph.blocks)
  off = _searched(monkeypatch, q, Switches(aligned_grid=False))
  assert off == [b.span for b in quantize.coarser(q).blocks]
  # No aligned grid (mshape): the coarser one, switch or not.
  m = _mshape()
  assert _searched(monkeypatch, m, Switches(aligned_grid=True)) == [
      b.span for b in quantize.coarser(m).blocks]


def test_on_by_default_and_the_environment_turns_it_off():
  assert Switches().aligned_grid
  assert switches_lib.from_env({}).aligned_grid
  assert not switches_lib.from_env(
      {switches_lib.ALIGNED_GRID_ENV: "0"}).aligned_grid
