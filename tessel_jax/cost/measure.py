"""Block profiling: every kernel compiled alone and timed on the real device.

For each kernel of a :class:`passes.kernels.KernelSet` (one per placement
block: ``F``, ``B`` and, with a split backward, ``W``):

* **time**: the kernel is jitted alone with its local input shapes and
  full-shaped parameters (a parameter sharded over the pipe axis is gathered
  before its block runs in the lowering, so the kernel sees the whole leaf),
  compiled for the device the program runs on, run ``warmup`` times, then
  timed ``repeats`` times with ``block_until_ready``; the median is kept. A
  very short kernel is run several times per timed sample and what the call
  itself costs is taken off (``call_timing.call_overhead``: an empty
  jitted call, plus a per-array cost for each further input and output,
  measured once per process), so the figure is the kernel's own compute
  as it runs inlined in the program, where no call, input or output array
  exists.
  The kernel is compiled inside a ``lax.cond`` branch, as the ticks run it
  (XLA's CPU backend compiles a nested computation differently: a
  weight-gradient convolution keeps a slow form there). A kernel the
  lowering runs with its parameter-only values hoisted out of the ticks
  (``passes.hoist``; ``hoisted`` of :func:`profile_kernels`) is timed so,
  with those values given as inputs (``cost.tick_kernel``).
  On the CPU backend a kernel is timed with every thread of the process on
  one core: inside a multi-device program each fake device runs its part
  on one thread (measured on JAX 0.10.2: a device computing while the other
  waits at a ``ppermute`` ran at single-core speed although the second core
  was free), while a kernel jitted alone spreads independent work over the
  process's threads. The devices of one process share its cores
  (``predict.predict_shared``). On that one core a sample is the smaller
  of its wall and the process's CPU time, so a loaded machine does not
  inflate the figure (``call_timing.time_calls``).
* **memory**: ``stash_bytes`` (what the forward keeps for the backward:
  residuals when the block keeps them, its inputs when it recomputes) and
  XLA's ``compiled.memory_analysis()`` temp bytes (the kernel's transient
  workspace).
* **edges**: bytes each graph edge moves from the kernel output avals
  (:func:`edge_bytes`).

Kernels with the same jaxpr, shapes and device share one measurement through
the cache key (``cost.kernel_keys.kernel_key``), in memory and on disk
(:class:`tessel_jax.cost.cache.ProfileCache`). Profiling never runs inside
``shard_map``.
"""

from __future__ import annotations

import dataclasses
import functools
import os
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import jax
import numpy as np

from tessel_jax.cost.flops import analysed_flops, jaxpr_flops
from tessel_jax.cost import compile_ahead as _compile_ahead
from tessel_jax.cost import compile_pool as _compile_pool
from tessel_jax.cost import fused_grads as _fused_grads
from tessel_jax.cost import tick_kernel as _tick_kernel
from tessel_jax.cost.cache import ProfileCache
# Re-exported: callers (and the cost modules) use ``measure.kernel_key`` etc.
from tessel_jax.cost.kernel_keys import (kernel_avals, kernel_callable,
                                         kernel_flops, kernel_key,
                                         speed_flags)
from tessel_jax.cost.call_timing import (call_overhead, cpu_cores,
                                         example_array, restricted_cores,
                                         time_calls)

try:  # installed: passes/ is tessel_jax.passes
  from tessel_jax.passes.value_keys import stays_on_device  # type: ignore
except ImportError:  # run from the repository root
  from passes.value_keys import stays_on_device  # type: ignore



@dataclasses.dataclass(frozen=True)
class KernelProfile:
  """One kernel's measurement.

  Attributes:
    block_id: Graph block id.
    label: ``F3``, ``B3`` or ``W3``.
    kind: ``F``, ``B`` or ``W``.
    fwd: Forward block index.
    devices: Devices of the block.
    seconds: Median compute seconds of one run on one device (local rows),
      alone on the device (CPU: on one core).
    core_seconds: Core-seconds of one run (CPU: equal to ``seconds``, the
      kernel runs on one thread; elsewhere also ``seconds``).
    stash_bytes: Bytes the block keeps for the backward on one device (F
      kernels; 0 for the others): on a stage, each residual's shard over
      the GSPMD axes.
    temp_bytes: XLA temp (workspace) bytes of the kernel compiled alone.
    out_bytes: Bytes of the kernel's outputs on one device.
    key: Cache key (kernels with equal keys share one measurement).
    cached: Taken from the on-disk cache (not measured in this run).
  """

  block_id: int
  label: str
  kind: str
  fwd: int
  devices: tuple[int, ...]
  seconds: float
  core_seconds: float
  stash_bytes: int
  temp_bytes: int
  out_bytes: int
  key: str
  cached: bool


@dataclasses.dataclass(frozen=True)
class Profile:
  """Measurements of every kernel of one build.

  Attributes:
    kernels: By graph block id.
    edge_bytes: Bytes moved per graph edge ``(src, dst)`` between different
      devices (0 for an edge whose data stays on its devices).
    backend: ``cpu``, ``gpu``, ``tpu``...
    device_kind: The device's kind string.
    profile_seconds: Wall seconds spent profiling (compile and timing
      included; near 0 when everything came from the cache).
    measured: Distinct kernels measured in this run.
    from_cache: Distinct kernels read from the on-disk cache.
    estimated: Kernels estimated from their flops (``cost.estimate``), not
      measured (a screening build).
  """

  kernels: Mapping[int, KernelProfile]
  edge_bytes: Mapping[tuple[int, int], int]
  backend: str
  device_kind: str
  profile_seconds: float
  measured: int
  from_cache: int
  estimated: int = 0

  @property
  def cache_hit(self) -> bool:
    """True when nothing had to be measured (or estimated)."""
    return self.measured == 0 and self.estimated == 0

  def seconds(self) -> dict[int, float]:
    """Block id -> measured seconds."""
    return {b: k.seconds for b, k in self.kernels.items()}


# --- timing -----------------------------------------------------------------


#: Timing rounds per kernel; the smallest round median is kept.
ROUNDS = 2


def _timed(compiled: Any, pv: Any, dv: Any, device: Any, repeats: int,
           warmup: int, cores: int | None,
           stage: Any = None) -> tuple[float, float]:
  """(compute seconds, raw seconds per call) on ``cores`` cores (None: all).

  The call's own cost taken off is ``call_timing.call_overhead``'s for the
  kernel's arrays, or, for a kernel compiled in a group
  (``cost.grouped.Member``), the group's empty call timed alike."""
  empty = getattr(compiled, "empty_call", None)
  if empty is None:
    inputs = len(jax.tree.leaves((pv, dv)))
    outputs = len(jax.tree.leaves(compiled(pv, dv)))
  with restricted_cores(cores):
    # On one core the process's CPU time is the call's own work, also for a
    # stage's several device threads (all on that core, a waiting thread
    # blocks). By the wall, pipe2_model2's B0 (tp_bench, a 2-device stage)
    # took 23.1 ms at load 12; by the CPU clock 3.1 ms (2.0 ms at
    # real-time priority).
    one_core = cores == 1
    raw, _ = time_calls(lambda: compiled(pv, dv), repeats, warmup,
                         cpu_clock=one_core)
    if empty is not None:
      over, _ = time_calls(empty, repeats, warmup, cpu_clock=one_core)
    else:
      over = call_overhead(device, cores=cores, stage=stage).seconds(
          inputs, outputs)
  return max(raw - over, 0.05 * raw), raw


def _on_stage(kernel: Any, stage: Any) -> Callable[[Any, Any], Any]:
  """``kernel_callable(kernel)`` as it runs in the program on ``stage``:
  inside a ``shard_map`` manual over the pipe and data axes (one device
  each here), its parameters pinned to their GSPMD specs."""
  run = kernel_callable(kernel)
  specs = [stage.specs.get(l, ()) for l in kernel.params]
  P = jax.sharding.PartitionSpec

  def pinned(pvals: Any, dvals: Any) -> Any:
    pvals = [jax.lax.with_sharding_constraint(p, P(*s))
             if any(e is not None for e in s) else p
             for p, s in zip(pvals, specs)]
    return run(pvals, dvals)

  return jax.shard_map(pinned, mesh=stage.mesh, in_specs=(P(), P()),
                       out_specs=P(), axis_names=set(stage.manual),
                       check_vma=False)


def _stage_inputs(kernel: Any, p: Sequence[Any], d: Sequence[Any],
                  device: Any, stage: Any, rng: np.random.Generator
                  ) -> tuple[list[Any], list[Any]]:
  """Example parameters and inputs on ``device``, or on ``stage``'s
  devices with each parameter split by its spec."""
  if stage is None:
    return ([jax.device_put(example_array(a, rng), device) for a in p],
            [jax.device_put(example_array(a, rng), device) for a in d])
  P = jax.sharding.PartitionSpec
  put = lambda a, s: jax.device_put(
      example_array(a, rng), jax.sharding.NamedSharding(stage.mesh, P(*s)))
  return ([put(a, stage.specs.get(l, ())) for a, l in zip(p, kernel.params)],
          [put(a, ()) for a in d])


def lower_kernel(kernel: Any, param_avals: Sequence[Any], device: Any, *,
                 seed: int = 0, stage: Any = None,
                 hoist: bool = False) -> _compile_pool.Lowered:
  """``kernel`` alone lowered for ``device`` (or ``stage``, see
  :func:`time_kernel`) with its example inputs; compiled by
  ``compile_pool``. On one device it runs inside a ``lax.cond`` branch, as
  the ticks run it (its flag is the last input; ``cost.tick_kernel``);
  with ``hoist`` its parameter-only values are computed first and given
  after its inputs."""
  p, d = kernel_avals(kernel, param_avals)
  rng = np.random.default_rng(seed)
  pv, dv = _stage_inputs(kernel, p, d, device, stage, rng)
  t0 = time.perf_counter()
  if stage is None:  # as the ticks run it (cost.tick_kernel)
    f = _tick_kernel.traced(kernel, p, d, hoist)
    grads = len(kernel.grads) if _fused_grads.applies(kernel) else 0
    fn = _tick_kernel.tick_callable(f, len(d), grads)
    extra = _tick_kernel.example_inputs(f, p, device, rng)
    dv = (list(dv) + extra[:-1] +
          _tick_kernel.accumulators(f, grads, device, rng) + extra[-1:])
  else:
    fn = _on_stage(kernel, stage)
  lowered, flops = _lowered_and_flops(fn, pv, dv, stage is None)
  return _compile_pool.Lowered(lowered, pv, dv, flops,
                               time.perf_counter() - t0)


#: ``TESSEL_JAX_PROFILE_FLOPS=xla`` takes a profiled kernel's flops from
#: XLA's cost analysis of its lowered program (the path before session 42:
#: the StableHLO converted and analysed once more per kernel, 20-45 ms
#: each); by default they are counted on the jaxpr the lowering traced
#: (``cost.flops.jaxpr_flops``, as the estimates count theirs).
FLOPS_ENV = "TESSEL_JAX_PROFILE_FLOPS"


def _lowered_and_flops(fn: Callable[..., Any], pv: Any, dv: Any,
                       count: bool) -> tuple[Any, float | None]:
  """``fn`` jitted and lowered on ``(pv, dv)``, and (``count``) its flops:
  counted on the jaxpr traced for the lowering (one trace serves both), or
  with ``TESSEL_JAX_PROFILE_FLOPS=xla`` from XLA's cost analysis of the
  lowered program (:data:`FLOPS_ENV`)."""
  if not count:
    return jax.jit(fn).lower(pv, dv), None
  if os.environ.get(FLOPS_ENV, "") == "xla":
    lowered = jax.jit(fn).lower(pv, dv)
    return lowered, analysed_flops(lowered)
  traced = jax.jit(fn).trace(pv, dv)
  return traced.lower(), jaxpr_flops(traced.jaxpr)


def time_kernel(kernel: Any, param_avals: Sequence[Any], device: Any, *,
                repeats: int = 5, warmup: int = 2, seed: int = 0,
                rounds: int = ROUNDS, stage: Any = None,
                prepared: _compile_pool.Prepared | None = None,
                hoist: bool = False) -> dict[str, Any]:
  """Compiles ``kernel`` alone for ``device`` and times it (``prepared``:
  already compiled, :func:`lower_kernel` then ``compile_pool``; ``hoist``:
  see :func:`lower_kernel`).

  With ``stage`` (``cost.stage.Stage``) it is compiled for the stage's
  devices as the program runs it (``_on_stage``): parameters split over
  the GSPMD axes, the tensor-parallel collectives inside, temp bytes per
  device; on the CPU backend every device of the stage then shares the one
  core, so ``seconds`` are the stage's core-seconds.

  The timing runs ``rounds`` times (each the median of ``repeats``
  samples) and keeps the smallest: a round slowed by a busy neighbour is an
  outlier upwards, never downwards.

  On the CPU backend it is timed with every thread of the process on one
  core (see the module doc); ``core_seconds`` equals ``seconds``.

  Returns:
    ``{"seconds", "core_seconds", "raw_seconds", "host_cores",
    "temp_bytes", "compile_seconds"}``: median compute seconds (the
    call's overhead taken off, ``call_timing.call_overhead``, never below 5% of
    the raw figure), single-core seconds, the raw median per call, cores of the
    process (CPU), XLA temp bytes, compile seconds.
  """
  if prepared is None:
    prepared = _compile_pool.compile_all(
        [lower_kernel(kernel, param_avals, device, seed=seed, stage=stage,
                      hoist=hoist)])[0]
  compiled, pv, dv = prepared.compiled, prepared.pv, prepared.dv
  flops, compile_s = prepared.flops, prepared.compile_seconds
  temp = 0
  try:
    ma = compiled.memory_analysis()
    if ma is not None:
      temp = int(ma.temp_size_in_bytes)
  except Exception:  # pylint: disable=broad-except  (backend without it)
    temp = 0
  host = cpu_cores() if device.platform == "cpu" else None
  shard_stash = _stash_shard_bytes(kernel, compiled) if stage else None
  cores = 1 if host is not None else None
  if _fused_grads.applies(kernel, stage):
    p, d = kernel_avals(kernel, param_avals)
    adds = _fused_grads.twin(kernel, p, d, hoist, pv, dv)
    seconds, raw, adds_s = _fused_grads.timed(compiled, adds, pv, dv,
                                              repeats, warmup, cores, rounds)
    timings, extra = [(seconds, raw)], {"adds_raw_seconds": adds_s}
  else:
    timings = [_timed(compiled, pv, dv, device, repeats, warmup, cores, stage)
               for _ in range(max(1, rounds))]
    extra = {}
  seconds, raw = min(timings)
  out = {"seconds": seconds, "core_seconds": seconds,
         "raw_seconds": raw, "host_cores": host, "temp_bytes": temp,
         "compile_seconds": compile_s,
         "round_seconds": [t[0] for t in timings], **extra}
  if flops is not None:
    out["flops"] = flops  # calibrates cost.estimate.KernelEstimator
  if shard_stash is not None:
    out["stash_shard_bytes"] = shard_stash
  return out


def _stash_shard_bytes(kernel: Any, compiled: Any) -> int | None:
  """Bytes of ``kernel``'s residual outputs on one device of its stage:
  each residual's shard as XLA's sharding propagation placed it over the
  GSPMD axes (the program keeps them so in its stash), or None where the
  compiled kernel does not say."""
  try:
    outs = compiled.output_shardings[0]
  except Exception:  # pylint: disable=broad-except  (backend without it)
    return None
  if len(outs) != len(kernel.out_avals):
    return None
  total = 0
  for key, aval, sh in zip(kernel.outputs, kernel.out_avals, outs):
    if key[0] != "r":
      continue
    shape = tuple(sh.shard_shape(tuple(aval.shape)))
    total += int(np.prod(shape, dtype=np.int64)) * np.dtype(
        aval.dtype).itemsize
  return total


# --- edges ------------------------------------------------------------------


def _nbytes(aval: Any) -> int:
  return int(np.prod(aval.shape, dtype=np.int64)) * np.dtype(aval.dtype).itemsize


def _rows(kernel: Any, device: int, b: int) -> tuple[int, int]:
  if kernel.split <= 1:
    return (0, b)
  k = kernel.devices.index(device)
  return (k * b // kernel.split, (k + 1) * b // kernel.split)


def edge_bytes(graph: Any, ks: Any) -> dict[tuple[int, int], int]:
  """Bytes each edge of ``graph`` moves between devices.

  For every value the destination kernel reads from the source kernel, each
  destination device needs its rows (a shared block reads only its share);
  rows the device produced itself are local. The edge's figure is the
  largest amount any one destination device receives (devices receive in
  parallel). Edges whose data stays on its devices (residuals, same device
  sets) move 0 bytes.
  """
  b = ks.microbatch_rows
  out: dict[tuple[int, int], int] = {}
  for e in graph.edges:
    src, dst = ks.kernels.get(e.src), ks.kernels.get(e.dst)
    if src is None or dst is None:
      out[(e.src, e.dst)] = 0
      continue
    produced = {key: o for o, key in enumerate(src.outputs)}
    worst = 0
    for d in dst.devices:
      total = 0
      for r, ref in enumerate(dst.inputs):
        if ref.kind != "value" or ref.key not in produced:
          continue
        o = produced[ref.key]
        full = ks.value_avals.get(ref.key, src.out_avals[o])
        need = _nbytes(dst.in_avals[r])
        if stays_on_device(ref.key):
          continue
        rowed = bool(full.shape) and full.shape[0] == b
        if d not in src.devices:
          total += need
          continue
        if not rowed or not src.out_split[o]:
          continue  # d holds the whole value itself
        lo, hi = _rows(dst, d, b) if dst.in_split[r] else (0, b)
        mlo, mhi = _rows(src, d, b)
        own = max(0, min(hi, mhi) - max(lo, mlo))
        per_row = _nbytes(full) // max(1, full.shape[0])
        total += (hi - lo - own) * per_row
      worst = max(worst, total)
    out[(e.src, e.dst)] = worst
  return out


# --- profiling a kernel set ---------------------------------------------------


def profile_kernels(ks: Any, graph: Any, param_avals: Sequence[Any],
                    device: Any, *, cache: ProfileCache | None = None,
                    repeats: int = 5, warmup: int = 2,
                    memo: dict[str, dict[str, Any]] | None = None,
                    part: Any = None, stage: Any = None,
                    log: Callable[[str], None] | None = None,
                    estimator: Any = None,
                    hoisted: frozenset[int] = frozenset(),
                    before_measure: Callable[[Mapping[int, KernelProfile]],
                                             None] | None = None) -> Profile:
  """Measures every kernel of ``ks`` (each distinct one once).

  Args:
    ks: The kernel set (``passes.kernels.KernelSet``).
    graph: The placement graph (for the edges).
    param_avals: Full avals of every parameter leaf.
    device: The device to profile on (the mesh's first device).
    cache: On-disk cache (None: measure everything, store nothing).
    repeats: Timed samples per kernel (median kept).
    warmup: Untimed runs first.
    memo: Optional in-memory records by key, shared between calls (read and
      filled; a kernel found here counts as neither measured nor cached).
    part: The partition the kernels come from (keys from its blocks'
      jaxprs, no tracing; see :func:`kernel_key`).
    stage: Profile every kernel on this stage's devices, sharded as the
      program runs it (``cost.stage.Stage``; None: on ``device`` alone).
    log: Optional progress printer.
    estimator: A ``cost.estimate.KernelEstimator``: a kernel neither in
      ``memo`` nor on disk is estimated from its flops instead of being
      compiled and timed, once enough kernels are measured (single-device
      profiles only; estimates are not stored).
    hoisted: Block ids of the kernels the lowering runs with their
      parameter-only values computed before the ticks (``passes.hoist``):
      timed so (:func:`lower_kernel`'s ``hoist``).
    before_measure: Called before each kernel is compiled and timed, with
      the kernels known so far (measured, in ``memo`` or on disk; by block
      id): it may raise to stop the profile there (a caller's bound on the
      plan, ``cost.search_costs``). What was measured stays in ``memo``
      and the cache.
  """
  t0 = time.perf_counter()
  by_key: dict[str, dict[str, Any]] = memo if memo is not None else {}
  measured = estimated = 0
  out: dict[int, KernelProfile] = {}
  keys = {bid: kernel_key(k, param_avals, device,
                          part.blocks[k.fwd] if part is not None else None,
                          stage, hoist=bid in hoisted and stage is None)
          for bid, k in sorted(ks.kernels.items())}
  on_disk = _disk_records(keys, by_key, cache)
  ahead = _compile_ahead.Ahead(
      keys, ks, by_key, on_disk, param_avals, device, estimator, stage,
      lower_kernel, hoisted, room=_compile_ahead.room_under_bound(
          before_measure), bounded=before_measure is not None)
  for bid, key in keys.items():
    k = ks.kernels[bid]
    rec = by_key.get(key)
    if rec is None:
      rec = on_disk.get(key)
    if rec is None and estimator is not None and stage is None:
      rec = estimator.estimate(k, param_avals, by_key.values(), key=key)
      if rec is not None:
        estimated += 1
        _remember_estimated(key, k, param_avals, device, bid in hoisted)
        out[bid] = _kernel_profile(bid, k, rec, key, False)
        continue
    if rec is None:
      if before_measure is not None:
        before_measure(_known_kernels(keys, ks, by_key, on_disk))
      rec = time_kernel(k, param_avals, device, repeats=repeats, warmup=warmup,
                        stage=stage, prepared=ahead.take(key),
                        hoist=bid in hoisted)
      rec.update(label=k.label, backend=device.platform,
                 device_kind=device.device_kind)
      measured += 1
      _ESTIMATED.pop(key, None)
      if cache is not None:
        cache.put("kernel", key, rec)
      if log is not None:
        log(f"profiled {k.label}: {rec['seconds'] * 1e3:.3f} ms,"
            f" temp {rec['temp_bytes']} B, compile"
            f" {rec['compile_seconds']:.2f} s")
    by_key[key] = rec
    out[bid] = _kernel_profile(bid, k, rec, key, key in on_disk)
  return Profile(kernels=out, edge_bytes=edge_bytes(graph, ks),
                 backend=device.platform, device_kind=device.device_kind,
                 profile_seconds=time.perf_counter() - t0, measured=measured,
                 from_cache=len(on_disk), estimated=estimated)


def _known_kernels(keys: Mapping[int, str], ks: Any,
                   by_key: Mapping[str, Any], on_disk: Mapping[str, Any]
                   ) -> dict[int, KernelProfile]:
  """The kernels of ``keys`` (block id -> key) whose record is known
  already (measured: ``by_key``; or ``on_disk``), by block id: what
  :func:`profile_kernels` hands its ``before_measure``."""
  out: dict[int, KernelProfile] = {}
  for bid, key in keys.items():
    rec = by_key.get(key)
    cached = rec is None
    rec = on_disk.get(key) if rec is None else rec
    if rec is not None:
      out[bid] = _kernel_profile(bid, ks.kernels[bid], rec, key, cached)
  return out


def _disk_records(keys: Mapping[int, str], by_key: Mapping[str, Any],
                  cache: ProfileCache | None) -> dict[str, dict[str, Any]]:
  """The records on disk of the distinct ``keys`` not in ``by_key``, each
  file read once (:func:`profile_kernels` and ``compile_ahead.next_to_measure``
  both consult them)."""
  if cache is None:
    return {}
  got = {key: cache.get("kernel", key) for key in dict.fromkeys(keys.values())
         if key not in by_key}
  return {key: rec for key, rec in got.items() if rec is not None}


#: Kernels estimated by a screening profile, by cache key: what
#: :func:`compile_in_background` lowers (at most :data:`ESTIMATED_KEPT`).
_ESTIMATED: dict[str, Callable[[], _compile_pool.Lowered]] = {}
ESTIMATED_KEPT = 256


def _remember_estimated(key: str, kernel: Any, param_avals: Sequence[Any],
                        device: Any, hoist: bool) -> None:
  """Keeps how to lower ``key``'s kernel, estimated by a screening
  profile, for :func:`compile_in_background`."""
  if not _compile_pool.SPECULATE or key in _ESTIMATED:
    return
  if len(_ESTIMATED) >= ESTIMATED_KEPT:
    _ESTIMATED.pop(next(iter(_ESTIMATED)))
  _ESTIMATED[key] = functools.partial(lower_kernel, kernel, param_avals,
                                      device, hoist=hoist)


def compile_in_background(keys: Sequence[str]) -> int:
  """Lowers here the kernels of ``keys`` a screening profile estimated
  (and not compiled yet) and compiles them on the background thread
  (``compile_pool.BACKGROUND``): a full build that measures them later
  takes them compiled. Returns how many were handed over."""
  handed = 0
  for key in dict.fromkeys(keys):
    lower = _ESTIMATED.pop(key, None)
    if lower is None or _compile_pool.BACKGROUND.has(key):
      continue
    _compile_pool.BACKGROUND.submit(key, lower())
    handed += 1
  return handed


def forget_estimated() -> None:
  """Drops what :func:`compile_in_background` could still lower."""
  _ESTIMATED.clear()


def _kernel_profile(bid: int, k: Any, rec: Mapping[str, Any], key: str,
                    cached: bool) -> KernelProfile:
  """Block ``bid``'s :class:`KernelProfile` (kernel ``k``) from its
  measurement record."""
  return KernelProfile(
      block_id=bid, label=k.label, kind=k.kind, fwd=k.fwd,
      devices=tuple(k.devices), seconds=float(rec["seconds"]),
      core_seconds=float(rec.get("core_seconds", rec["seconds"])),
      stash_bytes=(int(rec.get("stash_shard_bytes", k.stash_bytes))
                   if k.kind == "F" else 0),
      temp_bytes=int(rec["temp_bytes"]),
      out_bytes=sum(_nbytes(a) for a in k.out_avals), key=key,
      cached=cached)


# Re-exported: the switch lives with the lookahead it sets.
BOUND_LOOKAHEAD_ENV = _compile_ahead.BOUND_LOOKAHEAD_ENV
