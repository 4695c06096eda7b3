"""Convolution taps that only read padding are sliced off (passes.dead_taps).

A 4-layer conv net on 2x2 images: a stride-2 3x3 convolution makes them 1x1,
then three 3x3 ``SAME`` convolutions see only their centre tap. With
``Switches(dead_taps=True)`` the program's convolutions read sliced kernels
(no 3x3 kernel left in any convolution, where the plain function has only
3x3 ones) and the step equals ``jax.value_and_grad``.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import pytest

import tessel_jax as tj
from tessel_jax import compat, placements
from tessel_jax.passes import dead_taps
from tessel_jax.passes.switches import Switches

import test_lowering_models as M

N = 4
CH = 8


@pytest.mark.parametrize("size,taps,stride,lo,hi,want", [
    (1, 3, 1, 1, 1, (1, 1)),      # 3x3 SAME on 1x1: the centre only
    (6, 3, 1, 1, 1, (0, 2)),      # every tap live
    (2, 3, 2, 0, 1, (0, 1)),      # stride 2 SAME on 2: the last tap dead
    (1, 7, 2, 3, 3, (3, 3)),      # a 7x7 stem on a 1x1 image
    (1, 3, 1, -1, -1, None),      # no output
])
def test_live_taps(size, taps, stride, lo, hi, want):
  assert dead_taps.live_taps(size, taps, stride, lo, hi) == want


def small_maps_model():
  """``loss(params, batch)``: 3x3 convs on 2x2 then 1x1 maps, cut in 2."""
  keys = jax.random.split(jax.random.PRNGKey(0), 5)
  params = {"w": [jax.random.normal(k, (3, 3, CH, CH)) * 0.3
                  for k in keys[:4]],
            "head": jax.random.normal(keys[-1], (CH,)) * 0.3}

  def loss(p, batch):
    x = batch["x"]
    for i, w in enumerate(p["w"]):
      x = jnp.tanh(jax.lax.conv_general_dilated(
          x, w, (2, 2) if i == 0 else (1, 1), "SAME",
          dimension_numbers=("NHWC", "HWIO", "NHWC")))
      if i == 1:
        x = tj.boundary(x)
    return jnp.mean((x.mean(axis=(1, 2)) @ p["head"]) ** 2)

  batch = {"x": jax.random.normal(jax.random.PRNGKey(1), (N * 2, 2, 2, CH))}
  return loss, params, batch


def _kernel_taps(step, params, batch) -> set[tuple[int, int]]:
  """The spatial shapes of every convolution's kernel in ``step``'s
  program (of ``CH`` x ``CH`` kernels: the forward's and the input
  cotangents')."""
  closed, _ = compat.make_jaxpr(step, params, batch)
  return {tuple(eqn.invars[1].aval.shape[:2])
          for eqn, _ in compat.iter_eqns_deep(closed.jaxpr)
          if compat.primitive_name(eqn) == "conv_general_dilated"
          and eqn.invars[1].aval.shape[2:] == (CH, CH)}


def test_sliced_step_equals_value_and_grad():
  fn, params, batch = small_maps_model()
  mesh = jax.make_mesh((2,), ("pipe",), devices=jax.devices()[:2])
  ref_loss, ref_grads = M.reference(fn, params, batch, N)
  step = tj.schedule(fn, mesh=mesh, placement=placements.vshape(2),
                     num_microbatches=N, cut="markers",
                     switches=Switches(dead_taps=True))
  loss, grads = step(params, batch)
  assert M.max_rel_err(loss, ref_loss) <= 1e-5
  assert M.max_rel_err(grads, ref_grads) <= 1e-5
  mb = jax.tree_util.tree_map(lambda x: x[:2], batch)
  assert _kernel_taps(fn, params, mb) == {(3, 3)}   # the check can fail
  assert _kernel_taps(step, params, batch) == {(1, 1), (2, 2)}


def test_programs_without_dead_taps_are_left_as_they_are():
  fn, params, batch = small_maps_model()
  big = {"x": jnp.zeros((2, 6, 6, CH))}   # 6x6 maps: every tap is live
  closed, _ = compat.make_jaxpr(fn, params, big)
  assert dead_taps.rewrite(closed) is closed
  kinds = ["embed", "layer", "head"]
  closed, _ = compat.make_jaxpr(M.chain_fn(kinds),
                                M.make_params(M.num_layers(kinds)),
                                M.make_batch(2))
  assert dead_taps.rewrite(closed) is closed
