"""Kernels compiled a few at a time (:data:`WORKERS`, now 1: one at a
time) before each is timed alone; up to :data:`AHEAD` (now 4) of them
lowered and compiled, pipelined, before the first of them is timed.

``measure.profile_kernels`` compiles and times every kernel it has not
measured yet. XLA compiles outside the GIL, so two kernels compiled on two
threads could take about the wall time of one on a 2-core machine (README GPT:
a cold ``placement="auto"`` choice spent ~10 s CPU compiling the kernels
of its full builds one after another). The timing itself stays serial and
starts only once both compiles are done: a kernel is timed on one core
with nothing else of this process running.

:func:`compile_pipelined` overlaps the two halves of preparing a batch:
lowering a kernel (Python: its trace and StableHLO, holding the GIL) and
compiling the one lowered before it (XLA, outside the GIL, on a compile
thread). The batch is returned once every kernel of it is compiled, so the
timing that follows still runs with no compile in flight.

:class:`Prefetch` holds the kernels compiled ahead (by cache key) until the
profiling loop reaches them; a kernel compiled ahead that the loop then
estimates or finds measured is dropped (a wasted compile, the figures are
the same).

:data:`BACKGROUND` compiles, on one background thread, the kernels that
``placement="auto"``'s screening estimated for the plans it is likely to
build in full (``tessel_jax.frontier_speculate``, :data:`SPECULATE`);
every timing in the process calls :func:`drain` first.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import time
from collections.abc import Callable, Sequence
from typing import Any

#: Kernels compiled at once (the process's compile threads). 1: each
#: kernel compiled just before it is timed. Two threads gave no wall gain
#: quiet (session 31) and cost CPU: cold ``placement="auto"`` on the README
#: GPT, 8 rounds paired at load 4-10 (session 32, BENCHMARKS.md "cold
#: choice CPU"), one thread / two: CPU median 0.946 (0.88-1.05, 6 of 8
#: below 1), wall 1.01 (0.84-1.18: not shown either way under load).
#: ``experiments.auto_plan_cold --compile_workers=2`` and
#: ``experiments.auto_plan_cold_compile`` compare them.
WORKERS = 1

#: Kernels ``measure.profile_kernels`` lowers and compiles (pipelined,
#: :func:`compile_pipelined`) before it times the first of them: the
#: lowering of each overlaps the compile of the one before. 1: each kernel
#: lowered, compiled and timed in turn (no overlap). 4 against 1, paired
#: (session 39, BENCHMARKS.md "Cold choice wall"): the README GPT's vshape(4)
#: kernel profile 0.950x wall (4 of 5 rounds below 1), cold
#: ``placement="auto"`` 0.938x wall (3 of 3) at load 2-4; CPU 0.99-1.02x;
#: kernel timings unchanged. ``experiments.auto_plan_cold --compile_ahead=1``
#: runs the old path.
AHEAD = 4


@dataclasses.dataclass(frozen=True)
class Prepared:
  """One kernel lowered and compiled for timing.

  Attributes:
    compiled: The compiled program, called as ``compiled(pv, dv)``.
    pv: Example parameters (on the device or stage).
    dv: Example inputs.
    flops: XLA's flops of the lowered program (None on a stage).
    compile_seconds: Wall seconds of its lowering and compile.
  """

  compiled: Any
  pv: Any
  dv: Any
  flops: float | None
  compile_seconds: float


@dataclasses.dataclass(frozen=True)
class Lowered:
  """One kernel lowered (``measure.lower_kernel``), not compiled yet."""

  lowered: Any
  pv: Any
  dv: Any
  flops: float | None
  lower_seconds: float


def compile_all(jobs: Sequence[Lowered], workers: int | None = None
                ) -> list[Prepared]:
  """``jobs`` compiled, ``workers`` at a time (one: in this thread; None:
  :data:`WORKERS`, read at the call)."""
  workers = WORKERS if workers is None else workers
  if workers <= 1 or len(jobs) <= 1:
    return [_compile_one(j) for j in jobs]
  with concurrent.futures.ThreadPoolExecutor(min(workers, len(jobs))) as pool:
    return list(pool.map(_compile_one, jobs))


def compile_pipelined(keys: Sequence[Any], lower: Callable[[Any], Lowered],
                      workers: int | None = None) -> list[Prepared]:
  """``lower(key)`` for each of ``keys`` in turn here, each compiled on
  ``workers`` compile threads (None: :data:`WORKERS`) as soon as it is
  lowered: the lowering of a kernel overlaps the compile of the ones
  before it. Returns once every one is compiled (a single key: lowered and
  compiled in this thread)."""
  workers = WORKERS if workers is None else workers
  if len(keys) <= 1:
    return compile_all([lower(k) for k in keys], 1)
  with concurrent.futures.ThreadPoolExecutor(max(1, workers)) as pool:
    futures = [pool.submit(_compile_one, lower(k)) for k in keys]
    return [f.result() for f in futures]


def _compile_one(job: Lowered) -> Prepared:
  """``job`` compiled, its lowering and compile seconds summed."""
  t0 = time.perf_counter()
  compiled = job.lowered.compile()
  return Prepared(compiled, job.pv, job.dv, job.flops,
                  job.lower_seconds + time.perf_counter() - t0)


class Prefetch:
  """Kernels compiled ahead of the profiling loop, by cache key."""

  def __init__(self, workers: int | None = None) -> None:
    self.workers = WORKERS if workers is None else workers
    self._ready: dict[str, Prepared] = {}
    self.compiled = 0  # kernels compiled here (ahead or not)

  def take(self, key: str) -> Prepared | None:
    """The kernel of ``key`` compiled ahead (None: not compiled yet)."""
    return self._ready.pop(key, None)

  def put(self, prepared: dict[str, Prepared]) -> None:
    """Kernels compiled elsewhere (``cost.grouped``), by key."""
    self._ready.update(prepared)
    self.compiled += len(prepared)

  def compile(self, keys: Sequence[str],
              lower: Callable[[str], Lowered]) -> None:
    """Lowers ``keys`` here (``lower(key)``) and compiles them, each as
    soon as it is lowered (:func:`compile_pipelined`)."""
    for key, prepared in zip(keys, compile_pipelined(keys, lower,
                                                     self.workers)):
      self._ready[key] = prepared
    self.compiled += len(keys)


#: Kernels the screening of ``placement="auto"`` estimated, lowered and
#: compiled on a background thread while the screening goes on
#: (``frontier_speculate``), so that the full build that measures them
#: later takes them compiled (:func:`take_background`). Every timing in the
#: process first waits for that thread (:func:`drain`): a kernel is timed
#: with the process's threads on one core by the process CPU clock.
#: Off: not faster on a quiet machine (BENCHMARKS.md "Quiet re-measure,
#: session 41": 54.0 / 68.4 s against 50.1 / 53.5 s off; every kernel
#: handed over was taken, but the wall follows how many plans reach a full
#: build, 1 to 5); ``experiments.auto_plan_cold --speculate=True`` turns
#: it on.
SPECULATE = False


class Background:
  """Kernels compiled on one background thread, by cache key."""

  def __init__(self) -> None:
    self._pool: concurrent.futures.ThreadPoolExecutor | None = None
    self._jobs: dict[str, concurrent.futures.Future] = {}
    self.submitted = 0  # kernels handed to the thread (this process)
    self.taken = 0      # of them, taken compiled by a profile

  def has(self, key: str) -> bool:
    """Whether ``key``'s kernel is compiled (or compiling) here."""
    return key in self._jobs

  def submit(self, key: str, job: Lowered) -> None:
    """Compiles ``job`` (``key``'s kernel) on the background thread."""
    if key in self._jobs:
      return
    self._jobs[key] = self._executor().submit(_compile_one, job)
    self.submitted += 1

  def take(self, key: str) -> Prepared | None:
    """``key``'s kernel compiled (waiting for it and every compile still
    in flight: the caller times it next); None when it was not
    submitted or its compile failed."""
    prepared = self.take_call(key)
    if prepared is not None:
      self.taken += 1
    return prepared

  def call(self, key: str, fn: Callable[[], Any]) -> None:
    """Runs ``fn`` (a program's lowering and compile: ``price_ahead``) on
    the background thread; :meth:`take_call` gives its result."""
    if key not in self._jobs:
      self._jobs[key] = self._executor().submit(fn)

  def _executor(self) -> concurrent.futures.ThreadPoolExecutor:
    """The background thread (started at the first job)."""
    if self._pool is None:
      self._pool = concurrent.futures.ThreadPoolExecutor(
          1, thread_name_prefix="tj-speculate")
    return self._pool

  def take_call(self, key: str) -> Any:
    """What :meth:`call`'s ``fn`` returned for ``key`` (waiting for every
    compile in flight: the caller times it next); None when no call was
    made for ``key`` or it raised (the caller compiles it itself)."""
    future = self._jobs.pop(key, None)
    if future is None:
      return None
    self.drain()
    try:
      return future.result()
    except Exception:  # pylint: disable=broad-except  (compiled again)
      return None

  def discard(self, keys: Sequence[str]) -> None:
    """Drops the results of ``keys`` not taken (after waiting for them)."""
    for key in keys:
      future = self._jobs.pop(key, None)
      if future is not None:
        concurrent.futures.wait([future])

  def drain(self) -> None:
    """Waits until no compile is in flight on the background thread."""
    for future in list(self._jobs.values()):
      concurrent.futures.wait([future])

  def clear(self) -> None:
    """Drops every kernel compiled here and not taken (after waiting)."""
    self.drain()
    self._jobs.clear()


#: The process's background compiles (see :data:`SPECULATE`).
BACKGROUND = Background()


def drain() -> None:
  """Waits for the background compiles (:data:`BACKGROUND`): call before
  timing anything in this process."""
  BACKGROUND.drain()
