"""Flops counted on a jaxpr (``cost.flops.jaxpr_flops``): what the cheap
screening of ``placement="auto"`` estimates unmeasured kernels from, in
place of lowering each for XLA's cost analysis. The measured records carry
XLA's count, so the two must agree."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import pytest

from tessel_jax.cost import flops as F


def _both(fn, *args):
  return (F.jaxpr_flops(jax.make_jaxpr(fn)(*args)),
          F.analysed_flops(jax.jit(fn).lower(*args)))


def test_matmul_flops_counted_on_the_jaxpr():
  mine, xla = _both(lambda a, b: a @ b, jnp.ones((8, 16)), jnp.ones((16, 4)))
  assert mine == pytest.approx(2 * 8 * 16 * 4)
  assert mine == pytest.approx(xla)


def test_layer_and_its_vjp_agree_with_xla():
  w, h = jnp.ones((64, 64)) * 0.1, jnp.ones((32, 64))

  def layer(w, h):
    return jnp.sum(h + jnp.tanh(h @ w))

  def grads(w, h):
    return jax.grad(layer, argnums=(0, 1))(w, h)

  for fn in (layer, grads):
    mine, xla = _both(fn, w, h)
    assert mine == pytest.approx(xla, rel=0.05), fn.__name__


def test_nested_scan_counts_its_body_times_its_length():
  def body(c, x):
    return c @ x, None

  def scanned(c, xs):
    return jax.lax.scan(body, c, xs)[0]

  mine = F.jaxpr_flops(jax.make_jaxpr(scanned)(jnp.ones((4, 8)),
                                                jnp.ones((5, 8, 8))))
  assert mine == pytest.approx(5 * 2 * 4 * 8 * 8)


def test_no_flops_is_none():
  assert F.jaxpr_flops(jax.make_jaxpr(lambda x: x.reshape(-1))(
      jnp.ones((2, 3)))) is None
