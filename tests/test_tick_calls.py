"""The stand-in's extra goes with kernel calls, not ticks
(``TickModel.plus_calls``): two orders of the same calls, one in fewer
ticks, pay the same extra on each device, and a device idle in a tick pays
none of it there. Spread per tick (``TickModel.plus``), the order with fewer
ticks paid less: GPipe's 10 ticks on the README GPT's vshape pipe2 x dp2
were priced 0.903x the searched plan's 13 and measured 1.033x."""

from __future__ import annotations

import pytest

from tessel_jax.cost import ticks


def _model(n_ticks: int) -> ticks.TickModel:
  return ticks.TickModel(barriers={}, edge_delays=True,
                         tick_costs={s: 1e-3 for s in range(n_ticks)})


def _per_device_total(model: ticks.TickModel, steps) -> tuple[float, ...]:
  per = [model.tick_seconds(s) for s in steps]
  return tuple(sum(p[d] for p in per) for d in range(2))


def test_same_calls_in_fewer_ticks_pay_the_same_extra():
  packed = {0: (1, 0), 1: (1, 1), 2: (0, 1)}           # 3 ticks
  spread = {0: (1, 0), 1: (0, 1), 2: (1, 0), 3: (0, 1)}  # 4 ticks
  extra = 5e-4
  a = _model(3).plus_calls(extra, packed)
  b = _model(4).plus_calls(extra, spread)
  added_a = [x - 1e-3 * 3 for x in _per_device_total(a, range(3))]
  added_b = [x - 1e-3 * 4 for x in _per_device_total(b, range(4))]
  assert added_a == pytest.approx([2 * extra, 2 * extra])
  assert added_b == pytest.approx(added_a)
  # Per tick, the packed order paid less: the bias plus_calls removes.
  per_tick_a = sum(_model(3).plus(extra).tick_costs.values())
  per_tick_b = sum(_model(4).plus(extra).tick_costs.values())
  assert per_tick_a - 3e-3 < per_tick_b - 4e-3


def test_an_idle_device_pays_no_extra_and_per_device_costs_are_kept():
  model = ticks.TickModel(barriers={}, edge_delays=True,
                          tick_costs={0: 2e-3},
                          device_costs={0: (1e-3, 3e-3)})
  out = model.plus_calls(1e-3, {0: (0, 1)})
  assert out.tick_seconds(0) == pytest.approx((1e-3, 4e-3))
  assert out.tick_costs[0] == pytest.approx(2.5e-3)
  assert model.plus_calls(0.0, {0: (1, 1)}) is model
