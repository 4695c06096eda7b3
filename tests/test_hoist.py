"""Kernels' parameter-only work is computed once per step, not per tick.

A 4-layer conv net cut in 2 blocks on vshape(2), N = 4: every input-gradient
convolution reverses its weight (``rev``, the conv transpose rule). With
``passes.hoist`` no ``rev`` is left inside the tick loops (the program's
``while``/``cond`` bodies) and one per distinct weight is computed before
them; without it (``Switches(hoist=False)``) they sit inside. Both programs equal
``jax.value_and_grad``, under the default (compact) and the loop lowering.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import tessel_jax as tj
from tessel_jax.passes import param_only
from tessel_jax.passes.switches import Switches
from tessel_jax import compat, placements

import test_lowering_models as M

N = 4
LAYERS = 4
CH = 8


def conv_model():
  """``loss(params, batch)``: 4 3x3 convs, cut after the second and a head."""
  keys = jax.random.split(jax.random.PRNGKey(0), LAYERS + 1)
  params = {"w": [jax.random.normal(k, (3, 3, CH, CH)) * 0.3
                  for k in keys[:LAYERS]],
            "head": jax.random.normal(keys[-1], (CH,)) * 0.3}

  def loss(p, batch):
    x = batch["x"]
    for i, w in enumerate(p["w"]):
      x = jnp.tanh(jax.lax.conv_general_dilated(
          x, w, (1, 1), "SAME", dimension_numbers=("NHWC", "HWIO", "NHWC")))
      if i == LAYERS // 2 - 1:
        x = tj.boundary(x)
    return jnp.mean((x.mean(axis=(1, 2)) @ p["head"]) ** 2)

  batch = {"x": jax.random.normal(jax.random.PRNGKey(1), (N * 2, 6, 6, CH))}
  return loss, params, batch


def _revs(step, params, batch) -> tuple[int, int]:
  """``(rev equations inside a loop or branch, rev equations outside)``
  in the program's jaxpr."""
  closed, _ = compat.make_jaxpr(step, params, batch)
  inside = outside = 0
  for eqn, path in compat.iter_eqns_deep(closed.jaxpr):
    if compat.primitive_name(eqn) != "rev":
      continue
    if any(p in ("while", "cond") for p in path):
      inside += 1
    else:
      outside += 1
  return inside, outside


@pytest.mark.parametrize("interpret_ramps", [0, 8], ids=["compact", "loops"])
def test_conv_weight_reverse_leaves_the_tick_loop(interpret_ramps):
  fn, params, batch = conv_model()
  mesh = jax.make_mesh((2,), ("pipe",), devices=jax.devices()[:2])
  ref_loss, ref_grads = M.reference(fn, params, batch, N)
  counts = {}
  for name, on in (("hoisted", True), ("plain", False)):
    step = tj.schedule(fn, mesh=mesh, placement=placements.vshape(2),
                       num_microbatches=N, cut="markers",
                       interpret_ramps=interpret_ramps,
                       switches=Switches(hoist=on))
    loss, grads = step(params, batch)
    counts[name] = _revs(step, params, batch)
    hoisted_bytes = step.built.report.hoisted_bytes
    # the memory model counts the 2 reversed weights (below) per device
    assert hoisted_bytes == (2 * 9 * CH * CH * 4 if name == "hoisted" else 0)
    assert M.max_rel_err(loss, ref_loss) <= 1e-5, name
    assert M.max_rel_err(grads, ref_grads) <= 1e-5, name
  assert counts["plain"][0] >= LAYERS - 1, counts   # the check can fail
  assert counts["hoisted"][0] == 0, counts
  # Layer 0 needs no input gradient; w1 (device 0) and w3 (device 1) sit in
  # the same slot of their class, so one rev computes both: 2 revs.
  assert counts["hoisted"][1] == 2, counts


def test_find_keeps_expansions_and_views_inside():
  def kernel(w, s, x):
    wr = jnp.flip(w.reshape(3, 3, CH, CH), (0, 1))  # work: hoisted
    y = jax.lax.conv_general_dilated(
        x, wr, (1, 1), "SAME", dimension_numbers=("NHWC", "HWIO", "NHWC"))
    return y * s + s.reshape(1, 1, 1, CH), w.reshape(9, CH * CH)
  closed = jax.make_jaxpr(kernel)(
      jnp.zeros((9 * CH * CH,)), jnp.zeros((CH,)), jnp.zeros((2, 6, 6, CH)))
  invars, _ = compat.jaxpr_io(closed)
  found = param_only.find(closed, invars[:2])
  assert [s[0] for s in found.signature] in (["rev"], ["jit"], ["pjit"]), found
  assert found.hoisted[0].aval.shape == (3, 3, CH, CH)
  args = [np.random.default_rng(i).standard_normal(v.aval.shape).astype(
      np.float32) for i, v in enumerate(invars)]
  hv = param_only.prelude(found, args[:2])
  got = param_only.rest(found, args, hv)
  want = kernel(*args)
  for g, w in zip(got, want):
    np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("spatial", [1, 6])
def test_find_stores_conv_kernels_as_xla_reads_them(spatial):
  """An input-gradient convolution's reversed kernel is stored transposed
  to HWIO; a kernel larger than its input (XLA swaps the convolution and
  reverses the kernel at every call) is stored reversed instead."""
  dn_in = jax.lax.ConvDimensionNumbers((0, 3, 1, 2), (2, 3, 0, 1),
                                       (0, 3, 1, 2))

  def kernel(w, x, g):
    y = jax.lax.conv_general_dilated(
        x, w, (1, 1), "SAME", dimension_numbers=("NHWC", "HWIO", "NHWC"))
    dx = jax.lax.conv_general_dilated(
        g, jax.lax.rev(w, (0, 1)), (1, 1), ((1, 1), (1, 1)),
        dimension_numbers=dn_in)
    return y, dx
  a = jnp.zeros((2, spatial, spatial, CH))
  closed = jax.make_jaxpr(kernel)(jnp.zeros((3, 3, CH, CH)), a, a)
  invars, _ = compat.jaxpr_io(closed)
  found = param_only.find(closed, invars[:1])
  want_stored = ([("perm", (0, 1, 3, 2))] if spatial > 3 else
                 [("rev", (0, 1))])
  assert list(found.stored) == want_stored, found.signature
  args = [np.random.default_rng(i).standard_normal(v.aval.shape).astype(
      np.float32) for i, v in enumerate(invars)]
  got = param_only.rest(found, args, param_only.prelude(found, args[:1]))
  for g, w in zip(got, kernel(*args)):
    np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-5)


def test_hoisted_values_are_held_against_the_memory_limit():
  # Under a memory limit the stash gets what is left after the hoisted
  # values too (they live for the whole step), so the reported peak stays
  # under the limit.
  fn, params, batch = conv_model()
  mesh = jax.make_mesh((2,), ("pipe",), devices=jax.devices()[:2])
  limits = {}
  for name, on in (("hoisted", True), ("plain", False)):
    step = tj.schedule(fn, mesh=mesh, placement=placements.vshape(2),
                       num_microbatches=N, cut="markers",
                       memory_limit=2**20, cost="uniform",
                       switches=Switches(hoist=on))
    rep = step.build(params, batch).report
    limits[name] = rep.memory_limit_bytes
    assert max(rep.peak_memory_bytes) <= 2**20, name
  assert limits["plain"] - limits["hoisted"] == 2 * 9 * CH * CH * 4
