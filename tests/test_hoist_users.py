"""Hoisted values are computed only on the devices whose kernels read them.

A 4-layer conv net on vshape(2), N = 4, device 1's layers wider than
device 0's (no slot shared between the devices' weights): with
``Switches.hoist_on_users`` each input-gradient weight reverse
(``passes.hoist``) is computed under a ``cond`` on the device index
(``passes.hoist_users``), none at the top level of the step; without it
every device computes every reverse. Both programs equal
``jax.value_and_grad``.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

import tessel_jax as tj
from tessel_jax import compat, placements
from tessel_jax.passes import hoist_users
from tessel_jax.passes import switches as _switches

import test_lowering_models as M

N = 4
CHANNELS = (4, 4, 8, 8, 4)  # layer i maps CHANNELS[i] -> CHANNELS[i + 1]


def conv_model():
  """``loss(params, batch)``: 4 3x3 convs, cut after the second."""
  keys = jax.random.split(jax.random.PRNGKey(0), 5)
  params = {"w": [jax.random.normal(k, (3, 3, a, b)) * 0.3
                  for k, a, b in zip(keys, CHANNELS, CHANNELS[1:])]}

  def loss(p, batch):
    x = batch["x"]
    for i, w in enumerate(p["w"]):
      x = jnp.tanh(jax.lax.conv_general_dilated(
          x, w, (1, 1), "SAME", dimension_numbers=("NHWC", "HWIO", "NHWC")))
      if i == 1:
        x = tj.boundary(x)
    return jnp.mean(x ** 2)

  batch = {"x": jax.random.normal(keys[4], (N * 2, 6, 6, CHANNELS[0]))}
  return loss, params, batch


def _revs(step, params, batch) -> tuple[int, int]:
  """``(rev equations at the step's top level, rev equations in a cond
  outside the tick loops)`` in the program's jaxpr."""
  closed, _ = compat.make_jaxpr(step, params, batch)
  top = guarded = 0
  for eqn, path in compat.iter_eqns_deep(closed.jaxpr):
    if compat.primitive_name(eqn) != "rev" or "while" in path:
      continue
    if "cond" in path:
      guarded += 1
    else:
      top += 1
  return top, guarded


def test_compute_gives_zeros_where_no_kernel_reads():
  closed = jax.make_jaxpr(lambda w: jnp.flip(w, 0) * 2)(jnp.ones((3, 2)))
  w = np.arange(6.0, dtype=np.float32).reshape(3, 2)
  eqns, reads, var = closed.jaxpr.eqns, closed.jaxpr.invars, \
      closed.jaxpr.outvars[0]
  values = {d: hoist_users.Value(eqns, reads, var, None, [w], frozenset({d}))
            for d in (0, 1)}
  got = hoist_users.compute(values, jnp.int32(1), 2)
  np.testing.assert_array_equal(got[1], np.flip(w, 0) * 2)
  np.testing.assert_array_equal(got[0], np.zeros_like(w))
  everywhere = hoist_users.compute(values, jnp.int32(1), 2, on_users=False)
  np.testing.assert_array_equal(everywhere[0], np.flip(w, 0) * 2)


def test_reverses_are_computed_on_their_device_only():
  fn, params, batch = conv_model()
  mesh = jax.make_mesh((2,), ("pipe",), devices=jax.devices()[:2])
  ref_loss, ref_grads = M.reference(fn, params, batch, N)
  counts = {}
  for on in (True, False):
    step = tj.schedule(fn, mesh=mesh, placement=placements.vshape(2),
                       num_microbatches=N, cut="markers", cost="uniform",
                       switches=_switches.Switches(hoist_on_users=on))
    loss, grads = step(params, batch)
    assert M.max_rel_err(loss, ref_loss) <= 1e-5, on
    assert M.max_rel_err(grads, ref_grads) <= 1e-5, on
    counts[on] = _revs(step, params, batch)
  # At least w1 (device 0), w2 and w3 (device 1) are reversed; every one
  # moves under a cond, none is computed twice.
  assert counts[False][0] >= 3 and counts[False][1] == 0, counts  # can fail
  assert counts[True] == (0, counts[False][0]), counts
