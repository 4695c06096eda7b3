"""Kernels compiled two at a time before each is timed (``cost.compile_pool``).

``measure.profile_kernels`` compiles the next kernel it will measure with
the current one; every kernel is still compiled once and timed alone, and
with an estimator no kernel is compiled ahead that the estimator would
price instead. With ``compile_pool.AHEAD`` it lowers and compiles a batch
of kernels, the lowering of each overlapping the compile of the one
before, and times none of them before the whole batch is compiled.
"""

from __future__ import annotations

import threading
import time

import jax
import numpy as np

from tessel_jax.cost import cache as cost_cache
from tessel_jax.cost import compile_pool, estimate, grouped, measure

import test_lowering_models as M


def _built():
  return M.uniform_chain_build(["embed", "layer", "layer", "head"],
                               [0, 0, 1, 1])


def _count_batches(monkeypatch) -> list[int]:
  """Sizes of the batches ``compile_pool.compile_all`` compiles with two
  compile threads (timing stubbed: 1 ms a call). The pool's path: each
  kernel its own program (``cost.grouped`` off, whatever the environment
  says)."""
  sizes: list[int] = []
  monkeypatch.setenv(grouped.ENV, "0")
  real = compile_pool.compile_pipelined
  monkeypatch.setattr(compile_pool, "WORKERS", 2)   # the pool at work
  monkeypatch.setattr(compile_pool, "AHEAD", 1)     # batches of WORKERS

  def counted(keys, lower, workers=None):
    sizes.append(len(keys))
    return real(keys, lower, workers)
  monkeypatch.setattr(compile_pool, "compile_pipelined", counted)
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


class _FakeLowered:
  """A lowered program whose compile records when it starts and ends."""

  def __init__(self, name, events):
    self.name, self.events = name, events

  def compile(self):
    self.events.append(("compile", self.name))
    time.sleep(0.05)
    self.events.append(("compiled", self.name))
    return self.name


def test_lowering_overlaps_the_compile_before_it():
  """The second kernel is lowered while the first compiles (on the compile
  thread), and the batch comes back only once both are compiled."""
  events: list[tuple[str, str]] = []
  first_compiling = threading.Event()

  def lower(key):
    if key == "b":   # the first compile started before this lowering ends
      events.append(("overlapped", str(first_compiling.wait(5.0))))
    events.append(("lowered", key))
    lowered = _FakeLowered(key, events)
    real = lowered.compile
    lowered.compile = lambda: (first_compiling.set(), real())[1]
    return compile_pool.Lowered(lowered, [], [], None, 0.0)

  got = compile_pool.compile_pipelined(["a", "b"], lower, workers=1)
  assert [p.compiled for p in got] == ["a", "b"]
  assert ("overlapped", "True") in events
  assert events.index(("lowered", "b")) < events.index(("compiled", "a"))
  assert all(p.compile_seconds > 0 for p in got)


def test_ahead_batches_compiled_before_any_is_timed(monkeypatch):
  """With ``AHEAD = 4`` and one compile thread every kernel is compiled
  once, in batches of at most 4, and no kernel is timed while a kernel of
  its batch is still compiling."""
  built = _built()
  sizes = _count_batches(monkeypatch)
  monkeypatch.setattr(compile_pool, "WORKERS", 1)
  monkeypatch.setattr(compile_pool, "AHEAD", 4)
  in_flight = [0]
  real_one = compile_pool._compile_one   # pylint: disable=protected-access

  def one(job):
    in_flight[0] += 1
    try:
      return real_one(job)
    finally:
      in_flight[0] -= 1
  monkeypatch.setattr(compile_pool, "_compile_one", one)
  timed_busy: list[int] = []

  def timed(fn, repeats, warmup, cpu_clock=False):
    timed_busy.append(in_flight[0])
    return 1e-3, 1
  monkeypatch.setattr(measure, "time_calls", timed)
  prof = _profile(built)
  distinct = len({p.key for p in prof.kernels.values()})
  assert prof.measured == distinct == sum(sizes)
  assert sizes[0] == min(4, distinct) and max(sizes) <= 4
  assert len(sizes) == -(-distinct // 4)
  assert timed_busy and set(timed_busy) == {0}


def test_ahead_stops_where_the_estimator_prices(monkeypatch):
  built = _built()
  sizes = _count_batches(monkeypatch)
  monkeypatch.setattr(compile_pool, "AHEAD", 4)
  monkeypatch.setattr(estimate, "MIN_SAMPLES", 3)
  prof = _profile(built, estimate.KernelEstimator())
  assert prof.measured == 3 and prof.estimated > 0
  assert sizes == [3]     # the three the estimator needs, none beyond
