"""A kernel timed per run inside a loop, beside its profile (a diagnostic).

``cost.measure`` prices a kernel by one call of it compiled alone, less
what a call of that many scalar arrays costs (``call_timing.call_overhead``).
Inside the pipelined program the kernel is inlined in the tick loop: no
call and no arrays around it. On the model zoo's small transformers (2
fake CPU devices, ``vshape(2)``, N = 8) a forward returns ~47 residuals and
runs ~95 XLA thunks, and the call-based figure came to 2-3x the kernel's
time per run in a plain loop (eqx_transformer's B0 0.37 against 0.14 ms,
session 31, load 12-18).

:func:`looped` compiles the kernel once inside a ``fori_loop`` whose trip
count is an argument: each run's inputs pass an ``optimization_barrier``
with the trip index (so XLA cannot hoist the run out of the loop) and its
outputs are carried (so it cannot drop the run). :func:`slope_seconds`
times one executable at two trip counts; their difference per run leaves
out everything the call costs, whatever its arrays. The zoo runner
(``experiments.model_zoo_kernels``) prints the busier device's sum of
these figures beside what the kernels add to their stand-in program.
It is not the profile: ``PROFILE_VERSION`` is unchanged.

:func:`thunk_count` counts what XLA's CPU runtime runs of a compiled
kernel: the instructions of its optimized HLO's entry computation less
those that run no thunk (parameters, constants, tuples, their elements,
bitcasts); a fusion counts once, a ``while`` or ``conditional`` once
(not its body). ``experiments.model_zoo_kernels`` prices a kernel as its
loop figure plus its thunks times a per-thunk figure fitted on the
reference program (a candidate model of what the program adds per run).
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from tessel_jax.cost import call_timing
from tessel_jax.cost import measure

#: HLO opcodes that run no thunk on XLA's CPU runtime (:func:`thunk_count`).
NO_THUNK_OPS = ("parameter", "constant", "tuple", "get-tuple-element",
                "bitcast")
_ENTRY = re.compile(r"^ENTRY [^\n]*\{\n(.*?)^\}", re.S | re.M)
_OPCODE = re.compile(r"=\s*(?:\([^=]*?\)|[\w\[\]{},:\s]*?)\s+([a-z][\w-]*)\(")

#: Extra runs of the longer sample (the shorter one runs the kernel once).
LOOP_RUNS = 8


def looped(fn: Callable[[Any, Any], Any]) -> Callable[[Any, Any, Any], Any]:
  """``g(pvals, dvals, trips)``: the outputs of ``fn(pvals, dvals)`` run
  ``trips`` times (``trips`` >= 1, an int32 scalar) inside one loop."""

  def run(pvals: Any, dvals: Any, trips: Any) -> Any:
    shapes = jax.eval_shape(fn, pvals, dvals)
    init = jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), shapes)

    def body(i: Any, carry: Any) -> Any:
      del carry  # every run writes all the outputs afresh
      p, d, _ = jax.lax.optimization_barrier((pvals, dvals, i))
      return fn(p, d)

    return jax.lax.fori_loop(0, trips, body, init)

  return run


def _sample(compiled: Any, pvals: Any, dvals: Any, trips: Any,
            cpu_clock: bool) -> float:
  """Seconds of one call at ``trips`` trips: the smaller of wall and
  process CPU time where ``cpu_clock`` (every thread of the process on one
  core: other processes do not inflate the CPU time)."""
  c0, t0 = time.process_time(), time.perf_counter()
  jax.block_until_ready(compiled(pvals, dvals, trips))
  wall = time.perf_counter() - t0
  return min(wall, time.process_time() - c0) if cpu_clock else wall


def slope_seconds(compiled: Any, pvals: Any, dvals: Any, *, repeats: int,
                  warmup: int, cpu_clock: bool, runs: int = LOOP_RUNS,
                  sample: Callable[..., float] = _sample) -> float:
  """Seconds per run of ``compiled`` (:func:`looped`, compiled).

  Each of two rounds times one trip and ``1 + runs`` trips, alternated
  ``repeats`` times; a round's figure is the difference of the two
  fastest samples over ``runs`` (a neighbour only slows a sample, so the
  fastest is the least disturbed). The smaller positive round is kept
  (0 where neither is positive).
  """
  one = jnp.asarray(1, jnp.int32)
  more = jnp.asarray(1 + runs, jnp.int32)
  for _ in range(max(1, warmup)):
    jax.block_until_ready(compiled(pvals, dvals, one))
    jax.block_until_ready(compiled(pvals, dvals, more))
  slopes = []
  for _ in range(2):
    short = [sample(compiled, pvals, dvals, one, cpu_clock)
             for _ in range(max(1, repeats))]
    long_ = [sample(compiled, pvals, dvals, more, cpu_clock)
             for _ in range(max(1, repeats))]
    slopes.append((min(long_) - min(short)) / runs)
  good = [s for s in slopes if s > 0]
  return min(good) if good else 0.0


def looped_kernel_seconds(kernel: Any, param_avals: Sequence[Any],
                          device: Any, *, repeats: int = 7, warmup: int = 2,
                          seed: int = 0) -> float:
  """Seconds per run of ``kernel`` (``passes.kernels.Kernel``) inside a
  loop on ``device`` (CPU: every thread of the process on one core, as
  ``measure.time_kernel`` times it)."""
  p, d = measure.kernel_avals(kernel, param_avals)
  rng = np.random.default_rng(seed)
  pv = [jax.device_put(call_timing.example_array(a, rng), device) for a in p]  # pylint: disable=protected-access
  dv = [jax.device_put(call_timing.example_array(a, rng), device) for a in d]  # pylint: disable=protected-access
  one = jnp.asarray(1, jnp.int32)
  compiled = jax.jit(looped(measure.kernel_callable(kernel))).lower(
      pv, dv, one).compile()
  on_cpu = device.platform == "cpu"
  with call_timing.restricted_cores(1 if on_cpu else None):
    return slope_seconds(compiled, pv, dv, repeats=repeats, warmup=warmup,
                         cpu_clock=on_cpu)


def thunk_count(hlo_text: str) -> int:
  """Thunks XLA's CPU runtime runs for one call of the compiled module of
  ``hlo_text`` (``compiled.as_text()``): the entry computation's
  instructions whose opcode is not in :data:`NO_THUNK_OPS`.

  Raises:
    ValueError: where the text has no ``ENTRY`` computation.
  """
  m = _ENTRY.search(hlo_text)
  if m is None:
    raise ValueError("thunk_count: the HLO text has no ENTRY computation;"
                     " pass compiled.as_text() of a compiled module")
  n = 0
  for line in m.group(1).splitlines():
    op = _OPCODE.search(line)
    if op is not None and op.group(1) not in NO_THUNK_OPS:
      n += 1
  return n


def kernel_thunks(kernel: Any, param_avals: Sequence[Any],
                  device: Any) -> int:
  """:func:`thunk_count` of ``kernel`` compiled alone for ``device`` (as
  ``measure.time_kernel`` compiles it)."""
  p, d = measure.kernel_avals(kernel, param_avals)
  sharding = jax.sharding.SingleDeviceSharding(device)
  p = [jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=sharding) for a in p]
  d = [jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=sharding) for a in d]
  compiled = jax.jit(measure.kernel_callable(kernel)).lower(p, d).compile()
  return thunk_count(compiled.as_text())
