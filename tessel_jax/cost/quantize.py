"""Measured seconds and bytes -> the search's integers (pure Python, no jax).

The CP-SAT search works on integer steps and integer memory units
(DESIGN §3). This module turns a profile into such a graph and says how much
the rounding costs:

* **time**: one step is ``resolution`` seconds; a block's span is its
  seconds over the resolution, rounded to the nearest step and at least 1.
  The default resolution is the coarsest that keeps the rounding error of
  the blocks (time-weighted) and of every device's load within
  ``tolerance``, with the busiest device's load per micro-batch capped at
  ``max_steps`` steps (the search slows with long spans; coarse steps also
  keep the lowering's tick count low).
* **communication**: an edge between blocks on different devices gets a
  ``delay`` of its seconds (bytes / bandwidth + latency, see
  ``tessel_jax.cost.link``) in the same steps, rounded to the nearest step.
* **memory**: bytes in units of ``ceil(largest |block memory| /
  memory_units)`` bytes; a block's memory is rounded *away from zero* (a
  stash reserves at least its bytes, its release frees what was reserved),
  and a byte limit is rounded *down* (:func:`limit_units`), so a plan that
  fits in units fits in bytes.

:func:`plan_error` is the relative error of a quantised plan:
``|quantised makespan * resolution - makespan with real durations| / real``.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from typing import Any

from tessel_jax.graph import BlockGraph, Edge

DEFAULT_MAX_STEPS = 24
DEFAULT_TOLERANCE = 0.05
MEMORY_UNITS = 16


@dataclasses.dataclass(frozen=True)
class Quantized:
  """A placement with integer spans, memory units and edge delays.

  Attributes:
    graph: The graph the search runs on.
    resolution: Seconds per step.
    memory_unit: Bytes per memory unit.
    seconds: Real seconds per block id.
    memory_bytes: Real memory delta (bytes) per block id.
    delay_seconds: Real seconds per edge ``(src, dst)``.
    block_errors: Per block id ``|span * resolution - seconds| / seconds``.
    time_error: Time-weighted block error ``sum |span*res - t| / sum t``.
    load_error: Largest per-device relative error of the load per
      micro-batch (sum of spans of the device's blocks).
    memory_units: The ``memory_units`` it was made with (the largest
      block memory in units): :func:`coarser` keeps them.
  """

  graph: BlockGraph
  resolution: float
  memory_unit: int
  seconds: Mapping[int, float]
  memory_bytes: Mapping[int, int]
  delay_seconds: Mapping[tuple[int, int], float]
  block_errors: Mapping[int, float]
  time_error: float
  load_error: float
  memory_units: int = MEMORY_UNITS

  def limit_units(self, limit_bytes: int | None) -> int | None:
    """A byte limit in this graph's memory units (rounded down)."""
    return limit_units(limit_bytes, self.memory_unit)


def to_steps(seconds: float, resolution: float, minimum: int = 1) -> int:
  """``seconds`` in steps of ``resolution``: nearest, at least ``minimum``."""
  if resolution <= 0:
    raise ValueError(f"resolution must be > 0 seconds, got {resolution}")
  return max(minimum, int(math.floor(seconds / resolution + 0.5)))


def memory_unit(memory_bytes: Sequence[int], units: int = MEMORY_UNITS) -> int:
  """Bytes per unit: the largest ``|memory|`` becomes ``units`` units."""
  biggest = max((abs(int(m)) for m in memory_bytes), default=0)
  return max(1, math.ceil(biggest / max(1, units)))


def to_units(nbytes: int, unit: int) -> int:
  """Bytes in units, rounded away from zero (conservative both ways)."""
  n = int(nbytes)
  if n < 0:
    return -to_units(-n, unit)
  return -(-n // unit)


def limit_units(limit_bytes: int | None, unit: int) -> int | None:
  """A byte limit in units, rounded down (None stays None, never < 0)."""
  if limit_bytes is None:
    return None
  return max(0, int(limit_bytes) // int(unit))


def _loads(graph: BlockGraph, values: Mapping[int, float],
           blocks: Sequence[Any] | None = None) -> list[float]:
  out = [0.0] * graph.num_devices
  for b in graph.blocks if blocks is None else blocks:
    for d in b.devices:
      out[d] += values[b.id]
  return out


def _errors(graph: BlockGraph, seconds: Mapping[int, float],
            resolution: float, blocks: Sequence[Any] | None = None
            ) -> tuple[dict[int, float], float, float]:
  """``(per-block, time-weighted, worst per-device load)`` rounding errors
  at ``resolution``, over ``blocks`` (default: all of ``graph``'s)."""
  blocks = graph.blocks if blocks is None else blocks
  spans = {b.id: to_steps(seconds[b.id], resolution) for b in blocks}
  q = {b: s * resolution for b, s in spans.items()}
  block = {b: abs(q[b] - t) / t if t > 0 else 0.0 for b, t in seconds.items()
           if b in q}
  total = sum(seconds[b.id] for b in blocks)
  weighted = (sum(abs(q[b.id] - seconds[b.id]) for b in blocks) /
              total) if total > 0 else 0.0
  real, got = _loads(graph, seconds, blocks), _loads(graph, q, blocks)
  load = max((abs(g - r) / r for r, g in zip(real, got) if r > 0), default=0.0)
  return block, weighted, load


def choose_resolution(graph: BlockGraph, seconds: Mapping[int, float], *,
                      max_steps: int = DEFAULT_MAX_STEPS,
                      tolerance: float = DEFAULT_TOLERANCE) -> float:
  """The coarsest resolution whose rounding error is within ``tolerance``.

  Tries the busiest device's load per micro-batch at ``S = 1, 2, ...,
  max_steps`` steps (resolution ``load / S``) and returns the first whose
  time-weighted block error and per-device load errors are all within
  ``tolerance``; if none is, the one of smallest error.

  Raises:
    ValueError: if a block's seconds are missing or not positive.
  """
  _check_seconds(graph, seconds)
  if max_steps < 1:
    raise ValueError(f"max_steps must be >= 1, got {max_steps}")
  busiest = max(_loads(graph, seconds))
  best, best_err = busiest / max_steps, math.inf
  for s in range(1, max_steps + 1):
    res = busiest / s
    _, weighted, load = _errors(graph, seconds, res)
    err = max(weighted, load)
    if err <= tolerance:
      return res
    if err < best_err - 1e-12:
      best, best_err = res, err
  return best


def _check_seconds(graph: BlockGraph, seconds: Mapping[int, float]) -> None:
  for b in graph.blocks:
    t = seconds.get(b.id)
    if t is None or not t > 0 or not math.isfinite(t):
      raise ValueError(
          f"block {b.label} (id {b.id}) has no positive measured seconds"
          f" ({t!r}); give every block a duration > 0")


def quantize(graph: BlockGraph, seconds: Mapping[int, float],
             memory_bytes: Mapping[int, int] | None = None,
             delay_seconds: Mapping[tuple[int, int], float] | None = None, *,
             resolution: float | None = None,
             max_steps: int = DEFAULT_MAX_STEPS,
             tolerance: float = DEFAULT_TOLERANCE,
             memory_units: int = MEMORY_UNITS) -> Quantized:
  """The search graph of ``graph`` for measured seconds, bytes and delays.

  Args:
    graph: The placement (its spans, memory and delays are replaced).
    seconds: Block id -> seconds per run (> 0).
    memory_bytes: Block id -> memory delta in bytes (default 0).
    delay_seconds: ``(src, dst)`` -> seconds between the end of ``src`` and
      the start of ``dst`` (communication); edges not listed get 0.
    resolution: Seconds per step (None: :func:`choose_resolution`).
    max_steps: Cap of the default resolution (busiest device's steps per
      micro-batch).
    tolerance: Rounding error the default resolution aims at.
    memory_units: The largest block memory becomes this many units.

  Raises:
    ValueError: for a missing or non-positive duration or resolution.
  """
  _check_seconds(graph, seconds)
  if resolution is None:
    resolution = choose_resolution(graph, seconds, max_steps=max_steps,
                                   tolerance=tolerance)
  if not resolution > 0:
    raise ValueError(f"time resolution must be > 0 seconds, got {resolution}")
  mem = {b.id: int((memory_bytes or {}).get(b.id, 0)) for b in graph.blocks}
  unit = memory_unit(list(mem.values()), memory_units)
  delays = {(e.src, e.dst): float((delay_seconds or {}).get((e.src, e.dst),
                                                            0.0))
            for e in graph.edges}
  blocks = tuple(
      dataclasses.replace(b, span=to_steps(seconds[b.id], resolution),
                          memory=to_units(mem[b.id], unit))
      for b in graph.blocks)
  edges = tuple(Edge(e.src, e.dst, to_steps(delays[(e.src, e.dst)],
                                            resolution, minimum=0))
                for e in graph.edges)
  qgraph = dataclasses.replace(graph, blocks=blocks, edges=edges)
  block_err, weighted, load = _errors(graph, seconds, resolution)
  return Quantized(graph=qgraph, resolution=float(resolution),
                   memory_unit=unit,
                   seconds={b.id: float(seconds[b.id]) for b in graph.blocks},
                   memory_bytes=mem, delay_seconds=delays,
                   block_errors=block_err, time_error=weighted,
                   load_error=load, memory_units=memory_units)


def plan_error(quantized_makespan: int, resolution: float,
               real_makespan_s: float) -> float:
  """``|quantised makespan * resolution - real makespan| / real makespan``."""
  if real_makespan_s <= 0:
    return 0.0
  return abs(quantized_makespan * resolution - real_makespan_s) / real_makespan_s


def summary(q: Quantized) -> dict[str, Any]:
  """JSON-able figures of a quantisation."""
  return {"resolution_s": q.resolution, "memory_unit_bytes": q.memory_unit,
          "time_error": round(q.time_error, 6),
          "load_error": round(q.load_error, 6),
          "max_block_error": round(max(q.block_errors.values(), default=0.0),
                                   6),
          "spans": {q.graph.block(b).label: q.graph.block(b).span
                    for b in q.graph.ids}}


def _on_grid(q: Quantized, resolution: float) -> BlockGraph | None:
  """``q``'s graph re-quantised at ``resolution`` (:func:`quantize` of its
  seconds, bytes and delays: spans and edge delays; memory units kept), or
  None where its spans are ``q``'s."""
  graph = quantize(q.graph, q.seconds, q.memory_bytes, q.delay_seconds,
                   resolution=resolution, memory_units=q.memory_units).graph
  if [b.span for b in graph.blocks] == [b.span for b in q.graph.blocks]:
    return None
  return graph


def _unfloored_error(graph: BlockGraph, seconds: Mapping[int, float],
                     resolution: float) -> float:
  """:func:`choose_resolution`'s rounding error (time-weighted blocks,
  per-device loads) over the blocks of at least half a step: a shorter
  block takes the one-step floor of any grid (peer_bench's zbv(4): the
  first block's input gradient, 0.2 ms beside ~10 ms kernels), which is
  no misestimate of the others."""
  kept = [b for b in graph.blocks if seconds[b.id] >= resolution / 2]
  if not sum(seconds[b.id] for b in kept) > 0:
    return math.inf
  _, weighted, load = _errors(graph, seconds, resolution, blocks=kept)
  return max(weighted, load)


def aligned(q: Quantized, tolerance: float = 2 * DEFAULT_TOLERANCE
            ) -> BlockGraph | None:
  """``q``'s graph on the grid of one step per typical kernel, or None.

  The step is the median seconds of the busiest device's blocks, adjusted
  so that device's load is a whole number of steps. Where kernels of
  nearly equal seconds round to different step counts on the default grid,
  the schedule's devices start their kernels at staggered steps and the
  lowering runs more ticks (peer_bench's zbv(4), whose F, B and W kernels
  all take ~10 ms: the default grid's 24 steps gave 3 and 4 step spans and
  66 ticks, stash 56 MB; this grid all 1, 51 ticks, stash 26 MB). None
  where the rounding error of the blocks of at least half a step
  (:func:`_unfloored_error`) exceeds ``tolerance`` or the spans are
  ``q``'s.
  """
  loads = _loads(q.graph, q.seconds)
  busiest = max(range(len(loads)), key=loads.__getitem__)
  own = sorted(q.seconds[b.id] for b in q.graph.blocks
               if busiest in b.devices)
  steps = max(1, int(round(loads[busiest] / own[len(own) // 2])))
  resolution = loads[busiest] / steps
  if _unfloored_error(q.graph, q.seconds, resolution) > tolerance:
    return None
  return _on_grid(q, resolution)


def coarser(q: Quantized) -> BlockGraph | None:
  """``q``'s graph re-quantised on a coarser grid (:func:`quantize` of its
  seconds, bytes and delays at that resolution: spans and edge delays;
  memory units kept), or None where there is none (or its spans are
  ``q``'s).

  ``q``'s busiest device takes ``S`` steps per micro-batch; the grid is the
  one of ``ceil(S / 2) .. S - 1`` steps with the smallest rounding error
  (:func:`choose_resolution`'s measure; ties: the coarser). A few per cent
  more or less in one kernel's measured seconds moves the default grid a
  long way, as the rounding error is not monotonic in ``S`` (peer_bench's
  4-stage mshape: 13-14 steps quiet, 19-20 with two busy processes beside
  the build, 5.4% at 13), and the search then orders blocks otherwise:
  there, schedules lowering to interpreted ticks that measured ~10% slower
  than the loop-form one of 13-14 steps
  (``step_schedule.coarse_candidate`` prices both).
  """
  busiest = max(_loads(q.graph, q.seconds))
  steps = int(round(busiest / q.resolution))
  best, best_err = None, math.inf
  for s in range(steps - 1, (steps + 1) // 2 - 1, -1):
    _, weighted, load = _errors(q.graph, q.seconds, busiest / s)
    if max(weighted, load) < best_err - 1e-12:
      best, best_err = busiest / s, max(weighted, load)
  return None if best is None else _on_grid(q, best)
