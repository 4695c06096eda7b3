"""Pricing helpers of ``tj.frontier``: the lower bound that prunes a plan
before its search, classic schedules priced by replay on a searched
plan's build, and the block count of the ``tj.boundary`` markers."""

from __future__ import annotations

import dataclasses
import time
import weakref
from collections.abc import Callable
from typing import Any

import jax

from tessel_jax import validate
from tessel_jax.cost import predict as _predict
from tessel_jax.cost import stash_fill as _stash_fill
from tessel_jax.frontier_result import Candidate, PricedPlan
from tessel_jax.search import baselines as _baselines


class Pruned(Exception):
  """A plan whose lower bound cannot beat the fastest plan priced so far."""


def step_lower_bound(costs: Any, n_local: int) -> float:
  """Seconds below which no schedule of a measured search graph can run.

  Every device runs its blocks one after the other (``n_local`` of each),
  at most one core each; on the CPU backend the pipeline's devices also
  share ``costs.shared_cores`` cores. So the step is at least
  ``n_local * max(busiest device's block seconds, all block core-seconds /
  shared cores)`` (``predict.predict_shared`` / ``predict.predict`` add
  waits, ticks and transfers on top).
  """
  graph = costs.graph
  per = costs.work if costs.work is not None else dict(
      costs.quantized.seconds)
  load = [0.0] * graph.num_devices
  for b in graph.blocks:
    for d in b.devices:
      load[d] += float(per.get(b.id, 0.0))
  bound = max(load, default=0.0)
  if costs.shared_cores:
    bound = max(bound, sum(load) / costs.shared_cores)
  return n_local * bound


def baseline_price(built: Any, c: Candidate, base: PricedPlan,
                   replay_run: Callable[..., float] | None = None,
                   base_replay_s: float | None = None,
                   stash_s_per_byte: float | None = None) -> PricedPlan:
  """Classic schedule ``c`` priced on ``built``, the build of the searched
  plan ``base`` of the same placement, width and N (same kernels,
  measurements and memory unit): its order is replayed with the measured
  block times, and the step scales ``base``'s full prediction (its FSDP
  collectives, packing and unpacking kept as they are) by the ratio of the
  two replays; its peak is ``base``'s with the stash swapped.

  With ``replay_run`` (the build's ``step.replay_run``) each schedule is
  replayed as it is lowered: its own tick plan, per-tick costs, rendezvous
  and held rounds, plus the per-tick seconds ``base``'s stand-in measured.
  Without it, block times and edge delays only: blind to the lowering
  (README GPT, 4 devices, quiet: the four interleaved pipe2 x dp2 plans
  were predicted within 4% of each other, 32.2-33.5 ms, and measured
  30.4-35.4 ms).

  ``base_replay_s``: ``replay_run(built.unrolled, built.plan)`` when the
  caller knows it (:func:`searched_replay`: one per build, however many
  classic schedules are priced on it).

  ``stash_s_per_byte`` (``cost.stash_fill.measure_seconds_per_byte``; None:
  not priced): the step also pays for the stash bytes it holds beyond
  ``base``'s, which ``base``'s stand-in priced for ``base`` only
  (``cost.stash_fill.extra_seconds``).
  """
  t0 = time.perf_counter()
  run = _baselines.run(c.plan, built.graph, c.microbatches // c.dp)
  validate.assert_valid(run)
  unit = built.memory_unit
  peaks = tuple(int(p - a * unit + b * unit) for p, a, b in zip(
      base.peak_bytes_per_device, built.unrolled.peak_memory,
      run.peak_memory))
  if base.unit == "steps":
    step = float(run.makespan)
  else:
    # The FSDP collectives, packing and unpacking run serially with the
    # ticks: not scaled.
    rep = built.report
    serial = float(getattr(rep, "fsdp_collective_ms", 0.0) or 0.0) + float(
        getattr(rep, "outside_ms", 0.0) or 0.0)
    if replay_run is not None:
      if base_replay_s is None:
        base_replay_s = replay_run(built.unrolled, built.plan)
      ratio = replay_run(run) / max(base_replay_s, 1e-12)
    else:
      ratio = replay(built, run) / replay(built, built.unrolled)
    step = serial + (base.step - serial) * ratio
    if stash_s_per_byte is not None:
      costs = getattr(replay_run, "costs", None)
      step += 1e3 * _stash_fill.extra_seconds(
          peaks, base.peak_bytes_per_device, stash_s_per_byte, len(peaks),
          getattr(costs, "shared_cores", None))
  return dataclasses.replace(base, candidate=c, step=step,
                             peak_bytes_per_device=peaks, source=run.source,
                             build_seconds=time.perf_counter() - t0)


class SearchedReplays:
  """The searched plan's own replay as lowered, once per build: every
  classic schedule of a placement, width and N divides by it
  (:func:`baseline_price`), on the screening build and again on the full
  one (README GPT, 4 devices, cold choice: 35 classic prices, 35 such
  replays of ~12 builds). Builds are held weakly (keys of a
  ``WeakKeyDictionary``: a build is hashed by identity, ``Built`` has
  ``eq=False``), so a dropped build's entry goes with it."""

  def __init__(self) -> None:
    self._seen: weakref.WeakKeyDictionary[Any, float] = (
        weakref.WeakKeyDictionary())
    self.computed = 0

  def __call__(self, built: Any, replay_run: Callable[..., float]) -> float:
    seconds = self._seen.get(built)
    if seconds is not None:
      return seconds
    seconds = replay_run(built.unrolled, built.plan)
    self.computed += 1
    self._seen[built] = seconds
    return seconds


def replay(built: Any, run: Any) -> float:
  """Seconds of ``run`` replayed with the build's measured block times."""
  rep = built.report
  ids = {b.label: b.id for b in built.graph.blocks}
  seconds = {ids[l]: ms / 1e3 for l, ms in rep.block_ms.items() if l in ids}
  delays = {}
  for key, ms in rep.edge_delay_ms.items():
    src, dst = key.split("->")
    delays[(ids[src], ids[dst])] = ms / 1e3
  return max(_predict.makespan_seconds(run, seconds, delays), 1e-12)


def trace_markers(fn: Callable[..., Any], params: Any, batch: Any,
                  kw: dict[str, Any]) -> Any | None:
  """``fn`` traced on one row of ``batch`` (``passes.tracing.Traced``:
  its jaxpr and the blocks its ``tj.boundary`` markers make); None when it
  does not trace (the builds will report the problem)."""
  from tessel_jax.passes import tracing as _tracing  # pylint: disable=import-outside-toplevel
  leaves = jax.tree_util.tree_leaves(batch)
  rows = int(leaves[0].shape[0])
  one = jax.tree_util.tree_map(
      lambda x: jax.ShapeDtypeStruct((1,) + tuple(x.shape[1:]), x.dtype)
      if rows else x, batch)
  p_avals = jax.tree_util.tree_map(
      lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), params)
  name = getattr(fn, "__name__", "fn")
  try:
    return _tracing.trace(fn, name, p_avals, one,
                          has_aux=bool(kw.get("has_aux", False)))
  except Exception:  # pylint: disable=broad-except
    return None


def marker_blocks(fn: Callable[..., Any], params: Any, batch: Any,
                  kw: dict[str, Any]) -> int | None:
  """Blocks the ``tj.boundary`` markers of ``fn`` make (None: no marker)."""
  traced = trace_markers(fn, params, batch, kw)
  return count_blocks(traced)


def count_blocks(traced: Any | None) -> int | None:
  """Blocks of a :func:`trace_markers` result (None: no marker)."""
  if traced is None or traced.num_blocks <= 1:
    return None
  return traced.num_blocks
