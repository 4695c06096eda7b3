"""The disk frontier's program digest reads typed PRNG keys closed over by
the program (flax nnx models carry them: ``nnx_transformer`` failed with
"JAX array with PRNGKey dtype cannot be converted to a NumPy array")."""

from __future__ import annotations

import jax
import jax.numpy as jnp

from tessel_jax import frontier_cache
from tessel_jax import plans as P


def _traced(seed):
  key = jax.random.key(seed)

  def fn(params, batch):
    noise = jax.random.normal(key, batch.shape)
    return jnp.mean((batch + noise) @ params["w"])
  return P.trace_markers(fn, {"w": jnp.ones((3, 2))}, jnp.ones((4, 3)), {})


def test_a_typed_key_constant_is_digested_by_its_data():
  a, b = _traced(0), _traced(1)
  assert a is not None and any(
      jax.dtypes.issubdtype(c.dtype, jax.dtypes.prng_key)
      for c in a.closed_jaxpr.consts if hasattr(c, "dtype"))
  assert frontier_cache.program_digest(a) == frontier_cache.program_digest(
      _traced(0))
  assert frontier_cache.program_digest(a) != frontier_cache.program_digest(b)


def test_paired_standins_enter_both_keys_only_when_on():
  from tessel_jax import frontier_keys  # pylint: disable=import-outside-toplevel
  import tessel_jax as tj  # pylint: disable=import-outside-toplevel
  mesh = tj.cpu_mesh(2)
  params, batch = {"w": jnp.ones((3, 2))}, jnp.ones((4, 3))
  fn = lambda p, b: jnp.mean(b @ p["w"])  # pylint: disable=unnecessary-lambda-assignment
  off = P.FrontierFunction(fn, mesh=mesh)
  on = P.FrontierFunction(fn, mesh=mesh, paired_standins=True)
  assert "paired_standins" not in frontier_keys._options(off)  # pylint: disable=protected-access
  assert frontier_keys._options(on)["paired_standins"] is True  # pylint: disable=protected-access
  assert (frontier_keys.program_key(off, params, batch) !=
          frontier_keys.program_key(on, params, batch))
