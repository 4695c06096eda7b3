"""passes.tick_order: ticks packed as early as each device's order allows.

vshape(2) with uniform spans (F 1, B 2) is planned as three ticks a period,
``F0 | B0 F1 | B1``; compacted, the same per-device order runs in two,
``F0 B1 | B0 F1``. The compacted program equals ``jax.value_and_grad``
(compact and loop lowering, 4 micro-batches). Off unless
``switches=Switches(tick_order=True)``, or ``TESSEL_JAX_TICK_ORDER=1`` for
steps made without ``switches`` (``passes.switches``).
"""

from __future__ import annotations

import types

import jax
import pytest

import tessel_jax as tj
from tessel_jax import placements
from tessel_jax.passes import switches, tick_order
from tessel_jax.schedule import Action

import test_hoist as H
import test_lowering_models as M


def _kernel(devices, reads=(), writes=()):
  return types.SimpleNamespace(
      devices=devices, outputs=tuple(writes),
      inputs=tuple(types.SimpleNamespace(kind="value", key=k) for k in reads))


# F0 (device 0) -> F1 (1) -> B1 (1) -> B0 (0); B0 also reads F0's residual.
_KERNELS = {0: _kernel((0,), writes=("y0", "r0")),
            1: _kernel((1,), reads=("y0",), writes=("y1",)),
            2: _kernel((1,), reads=("y1",), writes=("c1",)),
            3: _kernel((0,), reads=("c1", "r0"))}


def _three_tick(n):
  acts = [Action(0, 0, 0), Action(1, 1, 0), Action(2, 2, 0)]
  for m in range(n):
    if m + 1 < n:
      acts += [Action(3 * m + 3, 0, m + 1), Action(3 * m + 4, 1, m + 1),
               Action(3 * m + 5, 2, m + 1)]
    acts.append(Action(3 * m + 4, 3, m))
  return acts


def test_compact_pairs_forward_with_the_other_backward():
  got = tick_order.compact(_KERNELS, _three_tick(4))
  ticks = {}
  for a in got:
    ticks.setdefault(a.start, [None, None])[_KERNELS[a.block].devices[0]] = (
        a.block, a.microbatch)
  assert len(_three_tick(4)) == len(got) == 16
  assert max(ticks) + 1 == 10          # from 3 * 4 + 1 = 13 ticks
  assert ticks[4] == [(0, 2), (2, 1)]  # F0 beside B1, steady state
  assert ticks[5] == [(3, 1), (1, 2)]  # B0 beside F1
  # every device's order is kept
  for d in (0, 1):
    def order(acts):
      return [(a.block, a.microbatch) for a in sorted(acts, key=lambda a: a.start)
              if _KERNELS[a.block].devices[0] == d]
    assert order(got) == order(_three_tick(4))


def test_compact_waits_for_values_from_the_other_device():
  got = {(a.block, a.microbatch): a.start
         for a in tick_order.compact(_KERNELS, _three_tick(3))}
  for m in range(3):
    assert got[(1, m)] > got[(0, m)]
    assert got[(2, m)] > got[(1, m)]
    assert got[(3, m)] > got[(2, m)]


def test_off_unless_switched_on():
  acts = _three_tick(2)
  assert tick_order.apply(_KERNELS, acts, False) is acts
  assert tick_order.apply(_KERNELS, acts, True) is not acts
  assert not switches.Switches().tick_order
  assert not switches.from_env({}).tick_order
  assert switches.from_env({switches.TICK_ORDER_ENV: "1"}).tick_order


@pytest.mark.parametrize("interpret_ramps,n", [("auto", 4), (None, 4)])
def test_compacted_program_equals_value_and_grad(interpret_ramps, n):
  fn, params, _ = H.conv_model()
  batch = {"x": jax.random.normal(jax.random.PRNGKey(1), (n * 2, 6, 6, H.CH))}
  mesh = jax.make_mesh((2,), ("pipe",), devices=jax.devices()[:2])
  ref_loss, ref_grads = M.reference(fn, params, batch, n)
  ticks = {}
  for on in (False, True):
    step = tj.schedule(fn, mesh=mesh, placement=placements.vshape(2),
                       num_microbatches=n, cut="markers", cost="uniform",
                       interpret_ramps=interpret_ramps,
                       switches=switches.Switches(tick_order=on))
    loss, grads = step(params, batch)
    ticks[on] = len(step.built.plan.ticks)
    assert M.max_rel_err(loss, ref_loss) <= 1e-5, on
    assert M.max_rel_err(grads, ref_grads) <= 1e-5, on
  assert ticks[True] < ticks[False], ticks
