"""Kernels compiled two at a time before each is timed (``cost.compile_pool``).

``measure.profile_kernels`` compiles the next kernel it will measure with
the current one; every kernel is still compiled once and timed alone, and
with an estimator no kernel is compiled ahead that the estimator would
price instead.
"""

from __future__ import annotations

import jax
import numpy as np

import tessel_jax as tj
from tessel_jax.cost import cache as cost_cache
from tessel_jax.cost import compile_pool, estimate, measure

import test_lowering_models as M


def _built():
  mesh = jax.make_mesh((2,), ("pipe",))
  kinds = ["embed", "layer", "layer", "head"]
  fn = M.chain_fn(kinds)
  params = M.make_params(M.num_layers(kinds))
  step = tj.schedule(fn, mesh=mesh, placement=tj.Placement([0, 0, 1, 1]),
                     num_microbatches=4, cost="uniform")
  return step.build(params, M.make_batch(16))


def _count_batches(monkeypatch) -> list[int]:
  """Sizes of the batches ``compile_pool.compile_all`` compiles with two
  compile threads (timing stubbed: 1 ms a call)."""
  sizes: list[int] = []
  real = compile_pool.compile_all
  monkeypatch.setattr(compile_pool, "WORKERS", 2)   # the pool at work

  def counted(jobs, workers=compile_pool.WORKERS):
    sizes.append(len(jobs))
    return real(jobs, workers)
  monkeypatch.setattr(compile_pool, "compile_all", counted)
  monkeypatch.setattr(measure, "time_calls",
                      lambda fn, repeats, warmup, cpu_clock=False: (1e-3, 1))
  return sizes


def _profile(built, estimator=None, cache=None):
  return measure.profile_kernels(
      built.kernels, built.graph, built.partition.traced.param_avals,
      jax.devices()[0], repeats=1, warmup=1, memo={},
      part=built.partition, estimator=estimator, cache=cache)


def test_each_kernel_compiled_once_two_at_a_time(monkeypatch):
  built = _built()
  sizes = _count_batches(monkeypatch)
  prof = _profile(built)
  distinct = len({p.key for p in prof.kernels.values()})
  assert prof.measured == distinct == sum(sizes)
  assert max(sizes) == compile_pool.WORKERS
  assert len(sizes) == -(-distinct // compile_pool.WORKERS)
  assert all(p.seconds > 0 and not p.cached for p in prof.kernels.values())


def test_disk_cache_read_once_per_kernel(monkeypatch, tmp_path):
  """Kernels compiled ahead are looked up on disk once, not again when
  their turn comes; a second profile reads every kernel from disk."""
  built = _built()
  sizes = _count_batches(monkeypatch)
  cache = cost_cache.ProfileCache(str(tmp_path))
  reads: list[str] = []
  real = cache.get
  monkeypatch.setattr(cache, "get",
                      lambda kind, key: reads.append(key) or real(kind, key))
  first = _profile(built, cache=cache)
  distinct = {p.key for p in first.kernels.values()}
  assert sorted(reads) == sorted(distinct) and sum(sizes) == len(distinct)
  assert len(sizes) == -(-len(distinct) // compile_pool.WORKERS)
  reads.clear()
  again = _profile(built, cache=cache)
  assert sorted(reads) == sorted(distinct) and sum(sizes) == len(distinct)
  assert again.measured == 0 and again.from_cache == len(distinct)
  assert all(p.cached for p in again.kernels.values())


def test_nothing_compiled_ahead_that_the_estimator_prices(monkeypatch):
  built = _built()
  sizes = _count_batches(monkeypatch)
  monkeypatch.setattr(estimate, "MIN_SAMPLES", 3)
  prof = _profile(built, estimate.KernelEstimator())
  assert prof.measured == 3 and prof.estimated > 0
  assert sizes == [2, 1]         # the third kernel alone: then it estimates


def test_compiled_together_run_like_compiled_alone():
  dev = jax.devices()[0]
  built = _built()
  avals = built.partition.traced.param_avals
  ks = list(built.kernels.kernels.values())[:3]
  jobs = [measure.lower_kernel(k, avals, dev) for k in ks]
  together = compile_pool.compile_all(jobs, workers=2)
  alone = compile_pool.compile_all(jobs, workers=1)
  for a, b in zip(together, alone):
    np.testing.assert_array_equal(
        np.asarray(jax.tree.leaves(a.compiled(a.pv, a.dv))[0]),
        np.asarray(jax.tree.leaves(b.compiled(b.pv, b.dv))[0]))
    assert a.compile_seconds > 0
