"""Zero-filled accumulators each written by a fill of its own.

Four 32x32 dense layers on vshape(2), two per device, parameters in slots
(``param_layout="slots"``: one slot class of two accumulators per device):
with ``Switches.distinct_fills`` the compiled program copies no
weight-shaped zero fill into another carry (XLA merged the equal fills and
copied the one into each before, ``passes.zero_fill``); both programs
equal ``jax.value_and_grad``.
"""

from __future__ import annotations

import re

import jax
import jax.numpy as jnp
import pytest

import tessel_jax as tj
from tessel_jax.passes import switches as _switches
from tessel_jax.passes import zero_fill

import test_lowering_models as M

N = 4
D = 32


def four_layers():
  """``(loss, params, batch)``: 4 ``tanh`` dense layers, cut after 2."""
  keys = jax.random.split(jax.random.PRNGKey(0), 5)
  params = {"w": [jax.random.normal(k, (D, D)) * 0.3 for k in keys[:4]]}

  def loss(p, batch):
    x = batch["x"]
    for i, w in enumerate(p["w"]):
      x = jnp.tanh(x @ w)
      if i == 1:
        x = tj.boundary(x)
    return jnp.mean(x ** 2)

  return loss, params, {"x": jax.random.normal(keys[4], (N * 2, D))}


def _weight_copies(text: str) -> int:
  """``copy`` instructions of the entry computation making a weight-shaped
  array from anything but a parameter (a zero fill copied into another
  carry; the parameters' own copies are the packing's)."""
  entry = text[text.index("\nENTRY"):]
  return len(re.findall(rf"= f32\[{D},{D}\]\S* copy\(%(?!param)", entry))


def test_fills_are_distinct_zeros():
  fills = zero_fill.Fills(jnp.int32(1))
  a, b = fills.zeros((2, 3), jnp.float32), fills.zeros((2, 3), jnp.float32)
  assert a.dtype == jnp.float32 and a.shape == (2, 3)
  assert not jnp.any(a) and not jnp.any(b)
  assert not jnp.any(jnp.signbit(a))
  assert fills.zeros((2,), jnp.int32).dtype == jnp.int32
  assert zero_fill.Fills(0).zeros((1,), jnp.bfloat16).dtype == jnp.bfloat16


def test_accumulators_are_not_copied_from_one_fill():
  fn, params, batch = four_layers()
  steps = M.steps_with_switch(fn, params, batch, N, "distinct_fills",
                              param_layout="slots")
  copies = {on: _weight_copies(step.lower(params, batch).compile().as_text())
            for on, step in steps.items()}
  assert copies[True] == 0, copies
  if copies[False] == 0:  # an XLA that no longer merges equal fills
    pytest.skip("this XLA copies no merged zero fill; nothing to compare")
  assert copies[False] >= 1, copies  # the check can fail: the fill copied


def test_prologue_switches_defaults_and_their_environment():
  assert _switches.Switches().distinct_fills
  assert _switches.Switches().hoist_on_users
  default = _switches.from_env({})
  assert default.distinct_fills and default.hoist_on_users
  off = _switches.from_env({_switches.DISTINCT_FILLS_ENV: "0",
                            _switches.HOIST_ON_USERS_ENV: "0"})
  assert not off.distinct_fills and not off.hoist_on_users
