"""Lowering switches travel with their step (``passes.switches``).

``tj.schedule(..., switches=Switches(...))`` turns a lowering step off (or
on) for that step only: steps made and lowered in one process, in any
order, keep their own (module state made one step's ablation leak into
the next). ``TESSEL_JAX_TICK_ORDER=1`` is read once, when a step is made
without ``switches``. Bad values are refused by name.
"""

from __future__ import annotations

import jax
import pytest

import tessel_jax as tj
from tessel_jax import placements
from tessel_jax.passes import switches
from tessel_jax.passes.switches import Switches

import test_hoist as H


def _step(fn, **options):
  mesh = jax.make_mesh((2,), ("pipe",), devices=jax.devices()[:2])
  return tj.schedule(fn, mesh=mesh, placement=placements.vshape(2),
                     num_microbatches=H.N, cut="markers", cost="uniform",
                     **options)


def test_two_steps_in_one_process_keep_their_own_switches():
  # Made first, traced around the other: the hoisting step has no reverse
  # inside its tick loops, the plain one has them, whatever the order.
  fn, params, batch = H.conv_model()
  hoisted = _step(fn)
  plain = _step(fn, switches=Switches(hoist=False))
  before = H._revs(hoisted, params, batch)
  off = H._revs(plain, params, batch)
  after = H._revs(_step(fn), params, batch)
  assert before == after and before[0] == 0, (before, after)
  assert off[0] >= H.LAYERS - 1, off
  assert plain.switches == Switches(hoist=False)
  assert hoisted.built.lowering.switches == Switches()
  assert plain.built.lowering.switches == Switches(hoist=False)


def test_the_environment_is_read_when_the_step_is_made(monkeypatch):
  fn, _, _ = H.conv_model()
  monkeypatch.delenv(switches.TICK_ORDER_ENV, raising=False)
  before = _step(fn)
  monkeypatch.setenv(switches.TICK_ORDER_ENV, "1")
  compacted = _step(fn)
  given = _step(fn, switches=Switches())
  assert not before.switches.tick_order
  assert compacted.switches.tick_order
  assert not given.switches.tick_order


def test_bad_switches_are_refused_by_name():
  fn, _, _ = H.conv_model()
  with pytest.raises(tj.TesselError, match=r"applied to 'loss': switches="
                     r"\{'hoist': False\}; use tessel_jax\.passes\.switches"
                     r"\.Switches\("):
    _step(fn, switches={"hoist": False})
  mesh = jax.make_mesh((2,), ("pipe",), devices=jax.devices()[:2])
  with pytest.raises(tj.TesselError, match=r"switches= applies to a named"
                     r" placement; placement='auto'"):
    tj.schedule(fn, mesh=mesh, placement="auto",
                switches=Switches(hoist=False))
