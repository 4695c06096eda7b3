"""An interp tick's held remote rounds are priced on the devices that copy
them (``cost.interp_rounds``).

With ``Switches.held_in_kernels`` (the default) a held remote round is
copied into its outbox by the kernel that made it, on its devices; without,
every device copies every remote round at every boundary. The price had
every device pay every round at every tick either way.
"""

from __future__ import annotations

import dataclasses

import jax

import tessel_jax as tj
import tessel_jax.passes.switches as switches_mod
from tessel_jax import placements
from tessel_jax.cost import interp_rounds
from tessel_jax.cost import link as cost_link
from tessel_jax.cost import ticks

from test_cost import _tiny


def _step(held_in_kernels: bool):
  fn, params, batch = _tiny(kinds=("embed", "head"))
  sw = dataclasses.replace(switches_mod.Switches(),
                           held_in_kernels=held_in_kernels)
  step = tj.schedule(fn, mesh=jax.make_mesh((2,), ("pipe",)),
                     placement=placements.vshape(2), num_microbatches=4,
                     interpret_ramps=0, cost="uniform", switches=sw)
  return step, step.build(params, batch).plan


def test_interp_ticks_price_held_rounds_where_their_kernels_copy_them():
  _, plan = _step(True)
  assert [s.kind for s in plan.segments] == ["interp"]
  spec = plan.interps[0]
  every = set(range(len(spec.sends)))
  remote = {i for i, rd in enumerate(spec.sends) if rd.remote}
  assert remote and remote != every
  on = interp_rounds.kernel_rounds(spec, plan, True)
  assert interp_rounds.kernel_rounds(spec, plan, False) is None
  assert interp_rounds.kernel_rounds(spec, plan, None) is None
  # An idle device copies no held round; every device writes (is priced)
  # every local round.
  assert set(on[None]) == every - remote
  kids = [k for k in spec.branches if k is not None]
  copied = set()
  for kid in kids:
    assert set(on[kid]) - remote == every - remote
    held = set(on[kid]) & remote
    # A kernel pays only held rounds it sends from its own out ports.
    mine = set(spec.out_map[kid])
    assert all(mine.intersection(spec.sends[i].candidates) for i in held)
    copied |= held
  assert copied == remote   # every held round is copied by some kernel

  link = cost_link.LinkModel(1e-3, 1e9)
  costs = ticks.TickCosts(per_port_s=1e-6, per_byte_s=1e-12)
  models = {h: ticks.tick_model(plan, link, costs, rendezvous=True,
                                held_in_kernels=h)
            for h in (True, False, None)}
  cheaper = saves = 0
  for t in plan.ticks:
    per = {h: m.tick_seconds(t.step) for h, m in models.items()}
    assert per[False] == per[None]
    ports = ticks.interp_device_ports(spec, t, on)
    for d, kid in enumerate(t.kernels):
      assert per[True][d] <= per[None][d]
      cheaper += per[True][d] < per[None][d]
      saves += len(set(on[kid]) & remote) < len(remote)
      own = 0.0 if kid is None else (
          len(spec.in_map.get(kid, ())) + len(spec.out_map.get(kid, ())) +
          ticks.GRAD_PORTS * len(spec.grad_map.get(kid, {})))
      assert ports[d] == own + len(on[kid])
  # A device-tick is cheaper where its kernel does not make every held
  # round (idle devices included).
  assert cheaper == saves > 0


def test_the_cost_model_prices_the_lowerings_switch():
  for held in (True, False):
    step, _ = _step(held)
    assert step._costs.held_in_kernels is held  # pylint: disable=protected-access
