"""Cold profiles compile every kernel first, together, then time them one by
one (``cost.ahead``): no timing overlaps a compile."""

from __future__ import annotations

import threading

import jax
import pytest

import tessel_jax as tj
from tessel_jax.cost import ahead, measure

import test_lowering_models as M


def test_compile_together_runs_every_thunk_and_keeps_errors():
  names = []

  def work(i):
    names.append(threading.current_thread().name)
    if i == 2:
      raise ValueError("no program 2")
    return i * 10

  got = ahead.compile_together({i: (lambda i=i: work(i)) for i in range(4)})
  assert sorted(got) == [0, 1, 2, 3]
  assert [got[i].get() for i in (0, 1, 3)] == [0, 10, 30]
  with pytest.raises(ValueError, match="no program 2"):
    got[2].get()                      # raised where the caller uses it
  assert any(n.startswith("tessel_jax-compile") for n in names)


def test_inside_a_mesh_context_the_thunks_run_in_the_calling_thread():
  mesh = jax.make_mesh((2,), ("pipe",),
                       axis_types=(jax.sharding.AxisType.Explicit,))
  names = []
  with jax.set_mesh(mesh):
    ahead.compile_together(
        {i: (lambda: names.append(threading.current_thread().name))
         for i in range(3)})
  assert names == [threading.current_thread().name] * 3


def test_profile_compiles_all_kernels_before_timing_any(monkeypatch):
  mesh = jax.make_mesh((2,), ("pipe",))
  kinds = ["embed", "layer", "head"]
  step = tj.schedule(M.chain_fn(kinds), mesh=mesh,
                     placement=tj.Placement([0, 0, 1]), num_microbatches=4,
                     cost="uniform")
  built = step.build(M.make_params(M.num_layers(kinds)), M.make_batch(16))
  events = []
  prepare, timed = measure.prepare_kernel, measure._timed  # pylint: disable=protected-access

  def spy_prepare(*args, **kwargs):
    events.append("compile")
    return prepare(*args, **kwargs)

  def spy_timed(*args, **kwargs):
    events.append("time")
    return timed(*args, **kwargs)

  monkeypatch.setattr(measure, "prepare_kernel", spy_prepare)
  monkeypatch.setattr(measure, "_timed", spy_timed)
  prof = measure.profile_kernels(
      built.kernels, built.graph, built.partition.traced.param_avals,
      jax.devices()[0], repeats=1, warmup=0, part=built.partition)
  assert prof.measured == events.count("compile") >= 3
  first_time = events.index("time")
  assert "compile" not in events[first_time:], events
  assert all(k.seconds > 0 for k in prof.kernels.values())
