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

from tessel_jax import compat
from tessel_jax.passes import hoist_users

import conv_models
import test_lowering_models as M

N = 4
CHANNELS = (4, 4, 8, 8, 4)  # layer i maps CHANNELS[i] -> CHANNELS[i + 1]


def conv_model():
  """``loss(params, batch)``: 4 3x3 convs, cut after the second."""
  return conv_models.conv_stack(CHANNELS, 6, N * 2, cut_after=1, scale=0.3)


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
  steps = M.steps_with_switch(fn, params, batch, N, "hoist_on_users")
  counts = {on: _revs(step, params, batch) for on, step in steps.items()}
  # At least w1 (device 0), w2 and w3 (device 1) are reversed; every one
  # moves under a cond, none is computed twice.
  assert counts[False][0] >= 3 and counts[False][1] == 0, counts  # can fail
  assert counts[True] == (0, counts[False][0]), counts
