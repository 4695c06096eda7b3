"""The main job's first parameters and optimiser state are made on the host:
no XLA program is compiled for them (``jax.random`` and ``jnp.zeros_like``
compiled about 28 small programs, ~3 CPU seconds of a cold start)."""

from __future__ import annotations

import jax
import numpy as np

from experiments import train_lib

_COMPILE = "/jax/core/compile/backend_compile_duration"


def _compiles(fn):
  seen = []
  listen = lambda event, duration, **kw: seen.append(event) if (
      event == _COMPILE) else None
  jax.monitoring.register_event_duration_secs_listener(listen)
  try:
    out = fn()
  finally:
    jax.monitoring.unregister_event_duration_listener(listen)
  return out, len(seen)


def test_init_and_adam_state_compile_nothing():
  params, n = _compiles(lambda: train_lib.init_params(5, 11, 8, 2, 6))
  assert n == 0
  state, n = _compiles(lambda: train_lib.zeros_like_host(params))
  assert n == 0
  leaves = jax.tree_util.tree_leaves(params)
  assert [x.shape for x in jax.tree_util.tree_leaves(state)] == [
      x.shape for x in leaves]
  assert not any(np.any(np.asarray(x)) for x in jax.tree_util.tree_leaves(
      state))
  assert params["wte"].shape == (11, 8) and params["wte"].dtype == np.float32
  assert 0.02 < float(np.std(np.asarray(params["layers"][0]["fc"]))) < 0.6


def test_a_jax_key_and_its_int_seed_draw_the_same_parameters():
  a = train_lib.init_params(3, 11, 8, 2, 6)
  b = train_lib.init_params(jax.random.PRNGKey(3), 11, 8, 2, 6)
  c = train_lib.init_params(4, 11, 8, 2, 6)
  assert np.array_equal(a["wpe"], b["wpe"])
  assert not np.array_equal(a["wpe"], c["wpe"])
