"""Kernels profiled on one stage's devices (issue 19, deliverable 4).

With a mesh axis left to GSPMD (tensor parallelism), ``cost="measured"``
compiles every kernel on the devices of one stage, its parameters split by
their specs: the profiled program holds the tensor-parallel all-reduce,
each device's parameter arguments are its shards, and the memory the
search leaves for the stash counts parameters, gradients and optimizer
slots at their per-device (shard) sizes.
"""

from __future__ import annotations

import re

import jax
import numpy as np
import pytest
from jax.sharding import PartitionSpec as P

import tessel_jax as tj
from tessel_jax.cost import measure
from tessel_jax.cost import model as cost_model
from tessel_jax.cost import predict
from tessel_jax.cost import stage as stage_mod

from test_lowering_models import max_rel_err, reference
from test_tensor_parallel import _batch, _mesh, _put, mlp_model


# Builds here price ticks with the microbenchmark's figures, not test them:
# measured once per worker and mesh (conftest.shared_tick_costs).
pytestmark = pytest.mark.usefixtures("shared_tick_costs")


def _measured_step(mesh_shape: dict[str, int], tmp_path: object,
                   split: bool = True) -> tuple:
  params, specs, fn = mlp_model()
  mesh = _mesh(mesh_shape)
  data = ("data",) if "data" in mesh_shape else ()
  batch = _batch(16, False)
  step = tj.schedule(fn, mesh=mesh, placement=tj.placements.vshape(2),
                     num_microbatches=4, plan="1f1b", data_axes=data,
                     cost="measured", cache_dir=str(tmp_path),
                     optimizer_slots=2)
  placed = _put(params, specs if split else jax.tree.map(
      lambda s: P(), specs, is_leaf=lambda x: isinstance(x, P)), mesh)
  got = step(placed, batch)
  assert max_rel_err(got, reference(fn, params, batch, 4)) < 1e-5
  return step, mesh, data


@pytest.fixture(scope="module")
def split_step(tmp_path_factory: pytest.TempPathFactory) -> tuple:
  """The Megatron MLP on (pipe=2, model=2), measured costs (built once)."""
  return _measured_step({"pipe": 2, "model": 2},
                        tmp_path_factory.mktemp("cache"))


def test_stage_is_one_pipe_and_data_index(split_step: tuple) -> None:
  step = split_step[0]
  mesh = _mesh({"pipe": 2, "data": 2, "model": 2})
  stage = stage_mod.stage_of(mesh, "pipe", ("data",), step.built.layout)
  assert stage is not None and stage.num_devices == 2
  assert dict(stage.mesh.shape) == {"pipe": 1, "data": 1, "model": 2}
  assert list(stage.mesh.devices.flat) == [mesh.devices[0, 0, 0],
                                           mesh.devices[0, 0, 1]]
  assert set(stage.specs.values()) == {(None, "model"), ("model", None)}
  # No GSPMD axis: kernels are profiled on one device, as before.
  assert stage_mod.stage_of(_mesh({"pipe": 2, "data": 2}), "pipe",
                            ("data",), step.built.layout) is None


def test_profiled_kernel_holds_the_tensor_parallel_all_reduce(
    split_step: tuple) -> None:
  step, mesh, data = split_step
  built = step.built
  stage = stage_mod.stage_of(mesh, "pipe", data, built.layout)
  avals = built.partition.traced.param_avals
  kernel = next(k for k in built.kernels.kernels.values() if k.kind == "F")
  p, d = measure.kernel_avals(kernel, avals)
  rng = np.random.default_rng(0)
  pv, dv = measure._stage_inputs(kernel, p, d, None, stage, rng)
  compiled = jax.jit(measure._on_stage(kernel, stage)).lower(pv, dv).compile()
  assert re.search(r"all-reduce(-start)?\(", compiled.as_text())
  whole = jax.jit(measure.kernel_callable(kernel)).lower(p, d).compile()
  # Each device's arguments hold its halves of the split weights.
  split = sum(int(np.prod(a.shape)) * 4 for a, l in zip(p, kernel.params)
              if l in stage.specs)
  assert (compiled.memory_analysis().argument_size_in_bytes ==
          whole.memory_analysis().argument_size_in_bytes - split // 2)
  # The stage joins the cache key: a sharded and an unsharded profile of
  # the same kernel never share a record.
  dev = mesh.devices.flat[0]
  assert (measure.kernel_key(kernel, avals, dev, stage=stage) !=
          measure.kernel_key(kernel, avals, dev))
  assert step.report.predicted_step_ms > 0


def test_memory_limit_counts_shards(split_step: tuple,
                                    tmp_path: object) -> None:
  """Parameters, gradients and 2 optimizer slots at shard size: the fixed
  bytes of the split layout are the replicated layout's less half of the
  split weights' four copies."""
  split = split_step[0]
  whole, _, _ = _measured_step({"pipe": 2, "model": 2}, tmp_path,
                               split=False)
  ls, lw = split.built.layout, whole.built.layout
  halves = sum(c.count * c.nbytes // 2 for c in ls.classes if c.spec)
  assert halves > 0
  assert [w - s for w, s in zip(lw.fixed_bytes_per_device(2),
                                ls.fixed_bytes_per_device(2))] == [
                                    4 * halves] * 2
  assert max(split.report.peak_memory_bytes) < max(
      whole.report.peak_memory_bytes)


def test_stash_counted_per_shard(split_step: tuple) -> None:
  """Issue 19: a forward's residuals split over ``model`` by XLA count
  their shard on each device, in the profile and in the predicted peak."""
  built = split_step[0].built
  shrunk = 0
  for bid, kp in built.profile.kernels.items():
    if kp.kind != "F":
      continue
    full = built.kernels.kernels[bid].stash_bytes
    assert full // 2 <= kp.stash_bytes <= full
    shrunk += full - kp.stash_bytes
  assert shrunk > 0
  full = cost_model.block_memory_bytes(built.graph, built.kernels)
  full_peak = max(predict._peaks(built.unrolled, full))
  assert 0 < max(split_step[0].report.stash_peak_bytes) < full_peak
