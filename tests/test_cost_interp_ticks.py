"""Interp ticks are priced per device (``cost.ticks.interp_device_traffic``).

In an interp tick (``passes.predicated``) every kernel of the segment sits
in a 0/1-trip while loop that only its devices enter: a device reads its
own kernel's ports, writes its out ports and adds its own gradients; every
device takes part in every message round. Pricing the union of the
segment's ports and accumulators on every device over-counted the README
GPT's interp ticks (pipe4: 135 MiB of accumulator traffic per device and
step that the program no longer moves).
"""

from __future__ import annotations

import dataclasses

import jax
import pytest

import tessel_jax as tj
from tessel_jax import placements
from tessel_jax.cost import link as cost_link
from tessel_jax.cost import predict, ticks

from test_cost import _tiny, _two_stage


def _compact_plan():
  fn, params, batch = _tiny(kinds=("embed", "head"))
  step = tj.schedule(fn, mesh=jax.make_mesh((2,), ("pipe",)),
                     placement=placements.vshape(2), num_microbatches=4,
                     interpret_ramps=0, cost="uniform")
  return step.build(params, batch).plan


def test_interp_ticks_price_each_devices_own_kernel():
  plan = _compact_plan()
  assert [s.kind for s in plan.segments] == ["interp"]
  spec = plan.interps[0]
  link = cost_link.LinkModel(1e-3, 1e9)
  costs = ticks.TickCosts(fixed_s=1e-4, per_byte_s=1e-9)
  model = ticks.tick_model(plan, link, costs, rendezvous=True)
  union = costs.seconds(ticks.tick_traffic(spec), ticks.tick_ports(spec))
  sends = ticks.tick_traffic(dataclasses.replace(
      spec, reads=(), out_ports=(), grads=()))
  idle_seen = busy_seen = False
  for t in plan.ticks:
    per = model.tick_seconds(t.step)
    assert isinstance(per, tuple) and len(per) == plan.num_devices
    assert model.tick_costs[t.step] == pytest.approx(sum(per) / len(per))
    for d, kid in enumerate(t.kernels):
      assert per[d] <= union + 1e-15
      if kid is None:  # an idle device pays the message rounds only
        idle_seen = True
        assert per[d] == pytest.approx(
            costs.seconds(sends, ticks.tick_ports(spec)))
      else:
        busy_seen = True
        assert per[d] > costs.seconds(sends, ticks.tick_ports(spec))
  assert idle_seen and busy_seen
  # A backward adds only its own gradients: less than every accumulator of
  # the segment (the old price of every device at every tick).
  b = next(k for k, kern in plan.kernels.items() if kern.grads)
  t = next(t for t in plan.ticks if b in t.kernels)
  d = t.kernels.index(b)
  assert model.tick_seconds(t.step)[d] < union
  # Adding a calibration term moves every device's cost alike.
  plus = model.plus(1e-5)
  assert plus.tick_seconds(t.step)[d] == pytest.approx(
      model.tick_seconds(t.step)[d] + 1e-5)


def test_replays_take_one_tick_cost_per_device():
  # F0 | F1 | B1 | B0 of one micro-batch on two devices; ticks cost device
  # 0 0.1 s and device 1 0.3 s. Plain replay: F0 0..1 and its tick to 1.1
  # on dev 0 (dev 1 ticks to 0.3); F1 1..3 on dev 1, tick to 3.3 (dev 0 to
  # 1.2); B1 3.3..6.3, tick 6.6 (dev 0 1.3); B0 on dev 0 6.3..10.3, its
  # tick to 10.4. With 0.3 s on both devices dev 0's ticks end at 10.6.
  run = _two_stage([(0, 0, 0), (1, 1, 0), (2, 2, 0), (4, 3, 0)])
  sec = {0: 1.0, 1: 2.0, 2: 3.0, 3: 4.0}
  per = lambda _step: (0.1, 0.3)
  plain = predict.predict(run, sec, tick_seconds=per)
  assert plain.step_seconds == pytest.approx(10.4)
  same = predict.predict(run, sec, tick_seconds=0.3)
  assert same.step_seconds == pytest.approx(10.6)
  # Shared cores, one per device: the same replay.
  ones = {b: 1.0 for b in sec}
  shared = predict.predict_shared(run, sec, ones, 2.0, tick_seconds=per)
  assert shared.step_seconds == pytest.approx(plain.step_seconds)
