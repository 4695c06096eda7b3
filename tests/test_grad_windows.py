"""Gradients of leaves read through slices are added over the slices' box.

Two 3x3 ``"SAME"`` convolutions on 1x1 feature maps (dead taps: each block
reads one tap of its ``(3, 3, C, C)`` weight, ``passes.dead_taps``) on
vshape(2), N = 4: with ``Switches.grad_windows`` the compiled program adds
the live tap's gradient into a window of the accumulator, so no
weight-sized ``pad`` (the slice's transpose) is left; without it every
backward pads and adds the whole weight. Both programs equal
``jax.value_and_grad``.
"""

from __future__ import annotations

import re

import jax
import jax.numpy as jnp

from tessel_jax.passes import grad_windows

import conv_models
import test_lowering_models as M

N = 4
CH = 32


def dead_tap_model():
  """``loss(params, batch)``: 2 3x3 convs on 1x1 maps, cut between."""
  return conv_models.two_convs(1, CH, N * 2)


def test_window_is_the_box_of_static_slices():
  def f(w, x):
    return w[1:2, 0:3] @ x + w[0:2, 1:2] @ x[:1]
  closed = jax.make_jaxpr(f)(jnp.ones((4, 4)), jnp.ones((3, 3)))
  jaxpr = closed.jaxpr
  w, x = jaxpr.invars
  assert grad_windows.window(jaxpr.eqns, jaxpr.outvars, w) == ((0, 0),
                                                               (2, 3))
  assert grad_windows.window(jaxpr.eqns, jaxpr.outvars, x) is None  # a dot
  nested = jax.make_jaxpr(lambda w: w[1:3][:, 2:3].sum() + w[0:1].sum())(
      jnp.ones((4, 4)))
  assert grad_windows.window(nested.jaxpr.eqns, nested.jaxpr.outvars,
                             nested.jaxpr.invars[0]) == ((0, 0), (3, 4))
  inner = jax.make_jaxpr(lambda w: w[1:3][:, 2:3].sum())(jnp.ones((4, 4)))
  assert grad_windows.window(inner.jaxpr.eqns, inner.jaxpr.outvars,
                             inner.jaxpr.invars[0]) == ((1, 2), (3, 3))
  whole = jax.make_jaxpr(lambda w: w[0:4, 0:4].sum())(jnp.ones((4, 4)))
  assert grad_windows.window(whole.jaxpr.eqns, whole.jaxpr.outvars,
                             whole.jaxpr.invars[0]) is None


def _weight_pads(text: str) -> int:
  """Ops of the compiled program that pad a weight's taps (the whole
  ``3 x 3`` or a row of them)."""
  return len(re.findall(rf"f32\[\d,\d,{CH},{CH}\]\S* pad\(", text))


def test_dead_tap_gradients_are_added_over_their_tap():
  fn, params, batch = dead_tap_model()
  pads = {}
  for on, step in M.steps_with_switch(fn, params, batch, N,
                                      "grad_windows").items():
    assert any(step.built.lowering.grad_windows.values()) == on
    text = step.lower(params, batch).compile().as_text()
    pads[on] = _weight_pads(text)
  assert pads[False] >= 2, pads     # the check can fail: one pad per weight
  assert pads[True] == 0, pads
