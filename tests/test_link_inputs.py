"""The link microbenchmarks (``cost.link``) time their collectives alone:
the input is made once on the host and placed as the program reads it.
Zeros made by jnp on one device were re-split over the mesh at every timed
call (a device-to-device transfer counted as link time), the bug
``cost.ticks`` had (test_tick_bench_inputs)."""

from __future__ import annotations

import jax
from jax.sharding import AxisType

from tessel_jax.cost import link

_COMPILE = "/jax/core/compile/backend_compile_duration"


def _compiles_without_resplit(measure) -> list[str]:
  """Compiles ``measure()`` triggers; raises on any device-to-device
  transfer (a re-split input)."""
  seen: list[str] = []
  listen = lambda event, duration, **kw: seen.append(event) if (
      event == _COMPILE) else None
  jax.monitoring.register_event_duration_secs_listener(listen)
  try:
    with jax.transfer_guard_device_to_device("disallow"):
      model = measure()
  finally:
    jax.monitoring.unregister_event_duration_listener(listen)
  assert model.source == "measured"
  return seen


def test_ring_link_runs_on_placed_inputs():
  mesh = jax.make_mesh((2,), ("pipe",), axis_types=(AxisType.Auto,),
                       devices=jax.devices()[:2])
  seen = _compiles_without_resplit(lambda: link.measure_link(
      mesh, "pipe", sizes=(1 << 12, 1 << 13), hops=2, repeats=2))
  assert len(seen) == 2, seen      # one program per size; no zeros


def test_gather_link_runs_on_placed_inputs():
  mesh = jax.make_mesh((2, 2), ("pipe", "data"),
                       axis_types=(AxisType.Auto,) * 2,
                       devices=jax.devices()[:4])
  seen = _compiles_without_resplit(lambda: link.measure_gather_link(
      mesh, "pipe", ("data",), sizes=(1 << 12, 1 << 13), hops=2, repeats=2))
  assert len(seen) == 2, seen
