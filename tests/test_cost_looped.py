"""tessel_jax.cost.looped: a kernel run many times inside one loop, as the
program runs it (what cost.measure times)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from tessel_jax.cost import looped as looped_mod
from tessel_jax.cost import measure


def _run(pvals, dvals):
  w, = pvals
  x, = dvals
  y = jnp.tanh(x @ w)
  g = jax.grad(lambda w: jnp.sum(jnp.tanh(x @ w)))(w)
  return [y, y.sum(axis=0)], [g]


def test_looped_runs_each_operand_set_and_sums_the_gradients():
  rng = np.random.default_rng(0)
  w = jnp.asarray(rng.standard_normal((6, 5)), jnp.float32)
  xs = jnp.asarray(rng.standard_normal((3, 4, 6)), jnp.float32)
  (bufs, sums) = jax.jit(looped_mod.looped(_run, 3))([w], [xs])
  for i in range(3):
    outs, _ = _run([w], [xs[i]])
    for b, o in zip(bufs, outs):
      np.testing.assert_allclose(b[i], o, rtol=1e-5, atol=1e-6)
  want = sum(_run([w], [xs[i]])[1][0] for i in range(3))
  np.testing.assert_allclose(sums[0], want, rtol=1e-5, atol=1e-5)


def test_profile_version_is_in_the_kernel_key(monkeypatch):
  """A record timed the old way (a whole executable) is never read as a
  looped one: the version joins every kernel's key."""

  class _K:
    params = (0,)
    in_avals = (jax.ShapeDtypeStruct((4, 6), jnp.float32),)
    fn = staticmethod(lambda ctx, p, d: _run(p, d))

  avals = [jax.ShapeDtypeStruct((6, 5), jnp.float32)]
  dev = jax.devices()[0]
  key = measure.kernel_key(_K(), avals, dev)
  monkeypatch.setattr(measure, "PROFILE_VERSION", measure.PROFILE_VERSION + 1)
  assert measure.kernel_key(_K(), avals, dev) != key


def test_loop_runs_shrink_for_large_kernels():
  """Eight runs of a small kernel; a kernel whose eight copies of inputs
  and outputs would pass LOOP_BYTES gets fewer, never none."""

  class _K:
    def __init__(self, rows):
      self.in_avals = (jax.ShapeDtypeStruct((rows, 1024), jnp.float32),)
      self.out_avals = (jax.ShapeDtypeStruct((rows, 1024), jnp.float32),)

  assert measure.loop_runs(_K(4)) == measure.LOOP_RUNS
  per_run = 2 * 4 * 1024 * 4096          # 32 MiB in + out
  assert measure.loop_runs(_K(4096)) == measure.LOOP_BYTES // per_run
  assert measure.loop_runs(_K(1 << 20)) == 1
