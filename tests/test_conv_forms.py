"""Convolutions bound in XLA:CPU's canonical order inside the ticks.

XLA canonicalises only the entry computation's convolutions; the ticks run
kernels in branches and loop bodies, where JAX's backward convolutions
(``f01b_i01o->01bf`` weight gradients, ``b01f_01oi->b01f`` input
gradients) ran as generic loops. ``passes.conv_forms`` (``Switches.
conv_forms``) binds every block convolution, forward and backward, in the
canonical order between explicit transposes (an im2col dot where XLA would
swap the operands): the lowered CNN's compiled program holds no other
convolution, and it still equals ``jax.value_and_grad``.
"""

from __future__ import annotations

import re

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from tessel_jax import compat
from tessel_jax.passes import conv_forms

import conv_models
import test_lowering_models as M

N = 4
CH = 8
FAST = "b01f_01io->b01f"


def _eqn(fn, *args):
  closed = jax.make_jaxpr(fn)(*args)
  eqns = [e for e in closed.jaxpr.eqns
          if compat.primitive_name(e) == "conv_general_dilated"]
  assert len(eqns) == 1
  return eqns[0]


CASES = [
    # (lhs shape, rhs shape, strides, padding, dimension numbers, kwargs)
    ((2, 6, 6, 4), (3, 3, 4, 5), (1, 1), "SAME", ("NHWC", "HWIO", "NHWC"),
     {}),
    ((2, 2, 2, 4), (3, 3, 4, 6), (1, 1), "SAME", ("NHWC", "HWIO", "NHWC"),
     {}),                                                # XLA swaps it
    ((2, 4, 7, 7), (6, 4, 3, 3), (2, 2), "SAME", ("NCHW", "OIHW", "NCHW"),
     {"rhs_dilation": (1, 2)}),
    ((2, 7, 4), (3, 2, 6), (2,), [(1, 0)], ("NWC", "WIO", "NWC"),
     {"feature_group_count": 2}),
]


def test_conv_value_and_vjp_equal_the_plain_convolution():
  rng = np.random.default_rng(0)
  for xs, ws, st, pad, dn, kw in CASES:
    x = jnp.asarray(rng.normal(size=xs), jnp.float32)
    w = jnp.asarray(rng.normal(size=ws), jnp.float32)
    plain = lambda x, w, st=st, pad=pad, dn=dn, kw=kw: (  # pylint: disable=unnecessary-lambda-assignment
        lax.conv_general_dilated(x, w, st, pad, dimension_numbers=dn, **kw))
    eqn = _eqn(plain, x, w)
    y0, vjp0 = jax.vjp(plain, x, w)
    y1, vjp1 = jax.vjp(lambda x, w, eqn=eqn: conv_forms.conv(x, w, eqn), x, w)
    np.testing.assert_allclose(y1, y0, rtol=1e-5, atol=1e-5)
    g = jnp.asarray(rng.normal(size=y0.shape), jnp.float32)
    for a, b in zip(vjp1(g), vjp0(g)):
      np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-4)


def test_swapped_is_what_xla_swaps():
  """``swapped`` against the compiled text: XLA's swap reverses the
  window (``rhs_reversal``)."""
  for hw, k, st in ((2, 3, 1), (4, 3, 1), (4, 3, 2), (1, 3, 1), (8, 7, 1)):
    x = jnp.ones((2, hw, hw, 4))
    w = jnp.ones((k, k, 4, 4))
    f = lambda x, w, st=st: lax.conv_general_dilated(  # pylint: disable=unnecessary-lambda-assignment
        x, w, (st, st), "SAME", dimension_numbers=("NHWC", "HWIO", "NHWC"))
    text = jax.jit(f).lower(x, w).compile().as_text()
    assert conv_forms.swapped(_eqn(f, x, w), x.shape, w.shape) == (
        "rhs_reversal" in text), (hw, k, st)


def cnn():
  """``loss(params, batch)``: two 3x3 convs on 4x4 maps, cut between."""
  return conv_models.two_convs(4, CH, N * 2)


def test_program_convolutions_take_the_canonical_order():
  fn, params, batch = cnn()
  slow = {}
  for on, step in M.steps_with_switch(fn, params, batch, N,
                                      "conv_forms").items():
    text = step.lower(params, batch).compile().as_text()
    labels = re.findall(r" convolution\([^\n]*dim_labels=([^,\s]+)", text)
    assert labels, on
    slow[on] = sum(l != FAST for l in labels)
  assert slow[False] >= 2, slow     # the check can fail: the weight grads
  assert slow[True] == 0, slow
