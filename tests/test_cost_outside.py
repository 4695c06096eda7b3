"""The step's part outside its ticks (``passes.outside``, ``cost.outside``):
packing the parameters and unpacking the gradients, timed once per
program shape and machine, cached, and part of the predicted step."""

from __future__ import annotations

import jax
import numpy as np
import pytest

import tessel_jax as tj
from tessel_jax import compat, placements

from test_cost import _tiny


# Builds here price ticks with the microbenchmark's figures, not test them:
# measured once per worker and mesh (conftest.shared_tick_costs).
pytestmark = pytest.mark.usefixtures("shared_tick_costs")

try:  # installed: passes/ is tessel_jax.passes
  from tessel_jax.passes import outside  # type: ignore
except ImportError:  # run from the repository root
  from passes import outside  # type: ignore


def _step(tmp_path, cost="measured"):
  fn, params, batch = _tiny(kinds=("embed", "head"))
  step = tj.schedule(fn, mesh=jax.make_mesh((2,), ("pipe",)),
                     placement=placements.vshape(2), num_microbatches=4,
                     cost=cost, cache_dir=str(tmp_path))
  step.build(params, batch)
  return step, params


def test_outside_program_unpacks_what_it_packed(tmp_path):
  # Packed parameters unpacked as gradients: every leaf comes back whole,
  # times the number of places holding it (gradients sum over them): the
  # tied embedding twice, a leaf no block reads (the tiny model's gate)
  # as zeros.
  step, params = _step(tmp_path, cost="uniform")
  built = step.built
  run = outside.outside_program(
      built.layout, compat.auto_mesh(step.mesh), step.pipe_axis, (),
      built.partition.traced.param_avals)
  got = jax.jit(run)(params)
  leaves = jax.tree_util.tree_leaves(params)
  assert len(got) == len(leaves)
  times = []
  for g, p in zip(got, leaves):
    g, p = np.asarray(g), np.asarray(p)
    assert g.shape == p.shape
    if not np.any(p):
      continue
    k = round(float(np.sum(g * p) / np.sum(p * p)))
    np.testing.assert_allclose(g, k * p, rtol=1e-6, atol=1e-6)
    times.append(k)
  assert sorted(times) == [0, 1, 2]


def test_outside_seconds_measured_cached_and_in_the_step(tmp_path):
  step, _ = _step(tmp_path)
  cold = step.report
  assert cold.outside_ms > 0
  assert cold.predicted_step_ms > cold.outside_ms
  files = [p.name for p in tmp_path.iterdir()]
  assert any(f.startswith("outside-") for f in files)
  warm, _ = _step(tmp_path)   # a new function: the figure from the cache
  assert warm.report.outside_ms == cold.outside_ms
  # A build that gives no timer prices nothing (uniform: no prediction).
  assert _step(tmp_path, cost="uniform")[0].report.outside_ms == 0.0


def test_gather_link_measured_over_the_data_axes():
  from jax.sharding import AxisType  # pylint: disable=import-outside-toplevel
  from tessel_jax.cost import link  # pylint: disable=import-outside-toplevel
  mesh = jax.make_mesh((2, 2), ("pipe", "data"),
                       axis_types=(AxisType.Auto,) * 2,
                       devices=jax.devices()[:4])
  model = link.measure_gather_link(mesh, "pipe", ("data",),
                                   sizes=(1 << 12, 1 << 18), hops=2,
                                   repeats=2)
  assert model.source == "measured" and model.bandwidth_bytes_per_s > 0
  one = jax.make_mesh((2, 1), ("pipe", "data"),
                      axis_types=(AxisType.Auto,) * 2,
                      devices=jax.devices()[:2])
  with np.testing.assert_raises(ValueError):
    link.measure_gather_link(one, "pipe", ("data",))
