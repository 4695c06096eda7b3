"""What a call costs, and timing calls on the cores they may use.

The kernel profile (:mod:`tessel_jax.cost.measure`) times each kernel as a
jitted call and takes off what the call itself costs; this module holds
that part: the cores the process may run on and how to pin its threads to
fewer (:func:`restricted_cores`), one timed sample per call of a function
(:func:`time_calls`), and the per-call and per-array overhead measured once
per device and process (:func:`call_overhead`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import statistics
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from tessel_jax.cost import compile_pool as _compile_pool

# A timed sample lasts at least this long (short kernels run several times).
MIN_SAMPLE_S = 2e-3
# At most this many calls per timed sample.
MAX_INNER = 64
# Scalars in and out of the near-empty functions that price one array.
OVERHEAD_ARRAYS = 32


def cpu_cores() -> int:
  """Cores this process may run on."""
  if hasattr(os, "sched_getaffinity"):
    return len(os.sched_getaffinity(0))
  return os.cpu_count() or 1


@contextlib.contextmanager
def restricted_cores(cores: int | None) -> Iterator[None]:
  """Runs the block with every thread of this process on ``cores`` cores.

  The first ``cores`` cores of the process's affinity; every thread's own
  affinity is restored afterwards. No-op where affinity cannot be set or
  ``cores`` is None or not fewer than the cores available.
  """
  _compile_pool.drain()  # no background compile while timing
  if (cores is None or not hasattr(os, "sched_setaffinity") or
      not os.path.isdir("/proc/self/task")):
    yield
    return
  allowed = sorted(os.sched_getaffinity(0))
  if cores >= len(allowed):
    yield
    return
  keep = set(allowed[:max(1, cores)])
  saved: dict[int, set[int]] = {}
  for name in os.listdir("/proc/self/task"):
    tid = int(name)
    try:
      saved[tid] = os.sched_getaffinity(tid)
      os.sched_setaffinity(tid, keep)
    except OSError:
      continue
  try:
    yield
  finally:
    for tid, aff in saved.items():
      try:
        os.sched_setaffinity(tid, aff)
      except OSError:
        pass


def example_array(aval: Any, rng: np.random.Generator) -> np.ndarray:
  if jnp.issubdtype(aval.dtype, jnp.inexact):
    return rng.standard_normal(aval.shape).astype(aval.dtype)
  return np.zeros(aval.shape, aval.dtype)


def time_calls(fn: Callable[[], Any], repeats: int, warmup: int,
                cpu_clock: bool = False) -> tuple[float, int]:
  """Median seconds per call of ``fn`` and the calls per timed sample.

  ``cpu_clock`` (the CPU backend, every thread of the process on one
  core): a sample is the smaller of its wall time and the process's CPU
  time. On one core the CPU time is the call's own work, which other
  processes do not inflate: at a load average of 8-17 on 2 cores the wall
  time of the same kernel varied 2-3x between runs, which skewed the spans
  (two towers' identical blocks measured 7.6 and 16.4 ms). On a quiet core
  both clocks agree.
  """
  _compile_pool.drain()  # no background compile while timing
  for _ in range(max(1, warmup)):
    jax.block_until_ready(fn())
  t0 = time.perf_counter()
  jax.block_until_ready(fn())
  first = time.perf_counter() - t0
  inner = int(min(MAX_INNER, max(1, MIN_SAMPLE_S // max(first, 1e-7))))
  samples = []
  for _ in range(max(1, repeats)):
    c0, t0 = time.process_time(), time.perf_counter()
    out = None
    for _ in range(inner):
      out = fn()
    jax.block_until_ready(out)
    wall = time.perf_counter() - t0
    if cpu_clock:
      wall = min(wall, time.process_time() - c0)
    samples.append(wall / inner)
  return statistics.median(samples), inner


_OVERHEAD: dict[Any, "CallOverhead"] = {}

@dataclasses.dataclass(frozen=True)
class CallOverhead:
  """What one call of a compiled function costs beyond its compute.

  Attributes:
    empty_s: An (almost) empty call: one scalar in, one out.
    per_input_s: Each further input array.
    per_output_s: Each further output array.
  """

  empty_s: float
  per_input_s: float
  per_output_s: float

  def seconds(self, inputs: int, outputs: int) -> float:
    """Overhead of a call with ``inputs`` and ``outputs`` arrays."""
    return (self.empty_s + self.per_input_s * max(0, inputs - 1) +
            self.per_output_s * max(0, outputs - 1))


def _call_seconds(fn: Callable[..., Any], args: Sequence[Any], repeats: int,
                  one_core: bool) -> float:
  """Seconds of one call of ``fn`` jitted, on ``args``."""
  f = jax.jit(fn).lower(*args).compile()
  sec, _ = time_calls(lambda: f(*args), repeats, 3, cpu_clock=one_core)
  return sec


def call_overhead(device: Any, repeats: int = 7, cores: int | None = None,
                  stage: Any = None) -> CallOverhead:
  """What a call costs on ``device`` (or ``stage``'s devices), measured once
  per device, core count and process on three near-empty functions: one
  scalar in and out, :data:`OVERHEAD_ARRAYS` scalars summed, one scalar
  scaled into as many outputs. Taken off every kernel time: inside the
  pipelined program kernels are inlined, and their inputs and outputs are
  the program's stash slots, not arrays of a call.

  Why: a transformer block's forward kernel returns ~90 residuals and its
  backward reads ~110 arrays; timed alone with only an empty call's cost
  taken off, eqx_transformer's kernels came to 1.6-2.3x the self time of
  their XLA thunks in one call (0.34 against 0.15 ms for F0) and in the
  program (0.12 ms), the model zoo's transformers were over-predicted.
  """
  key = (device.platform, device.id, cores,
         None if stage is None else stage.num_devices)
  if key not in _OVERHEAD:
    where = device if stage is None else jax.sharding.NamedSharding(
        stage.mesh, jax.sharding.PartitionSpec())
    n, one = OVERHEAD_ARRAYS, cores == 1
    xs = [jax.device_put(np.full((), i, np.float32), where) for i in range(n)]
    empty = _call_seconds(lambda v: v + 1, xs[:1], repeats, one)
    summed = _call_seconds(lambda *a: sum(a), xs, repeats, one)
    spread = _call_seconds(lambda v: [v * (i + 1) for i in range(n)],
                           xs[:1], repeats, one)
    _OVERHEAD[key] = CallOverhead(
        empty_s=empty, per_input_s=max(0.0, summed - empty) / (n - 1),
        per_output_s=max(0.0, spread - empty) / (n - 1))
  return _OVERHEAD[key]


