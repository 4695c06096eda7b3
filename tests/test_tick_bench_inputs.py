"""The per-tick microbenchmark (``cost.ticks``) times its program alone: its
inputs are made once, already placed as the program reads them. Zeros made
by jnp on one device were re-split over the mesh at every call (16 MiB for
the big ports, counted as tick traffic) and each cost a compile."""

from __future__ import annotations

import jax

from tessel_jax.cost import ticks

_COMPILE = "/jax/core/compile/backend_compile_duration"


def test_tick_program_compiles_once_and_runs_on_placed_inputs():
  mesh = jax.make_mesh((2,), ("pipe",))
  seen = []
  listen = lambda event, duration, **kw: seen.append(event) if (
      event == _COMPILE) else None
  jax.monitoring.register_event_duration_secs_listener(listen)
  try:
    run = ticks._tick_program(mesh, "pipe", 8, 4)  # pylint: disable=protected-access
    pool, acc = run()
    run()
  finally:
    jax.monitoring.unregister_event_duration_listener(listen)
  assert len(seen) == 1, seen     # the program; no zeros, no re-split
  assert pool.shape[0] == acc.shape[0] == 2
