"""Figures of an unrolled schedule and lower bounds for a placement.

``simulate`` replays a schedule's actions (DESIGN.md §3 semantics) and
reports its makespan, per-device busy steps, utilisation and bubbles, the
running memory of every device and a per-device timeline.
``lower_bound_makespan`` and ``lower_bound_period`` bound what any schedule
of a placement can reach, so a searched schedule can be judged against them.

``simulate`` does not check the schedule; run ``tessel_jax.validate.check``
first where validity is in doubt.

No jax, no ortools here.
"""

from __future__ import annotations

import dataclasses
from collections import defaultdict
from typing import Any

from tessel_jax.graph import BlockGraph


@dataclasses.dataclass(frozen=True)
class SimulationStats:
  """What a schedule does, device by device.

  Attributes:
    makespan: End of the last action, counted from step 0.
    busy_steps: Steps each device is occupied.
    utilisation: ``busy_steps / makespan`` per device (0 for makespan 0).
    bubble_ratio: Idle device-steps over ``num_devices * makespan``.
    peak_memory: Largest running memory sum per device (never below 0, the
      level every device starts at).
    memory_timeline: Per device, the ``(step, level)`` points at which the
      running memory changes (level after all events of the step); the level
      is 0 before the first point.
    device_timeline: Per device, ``(start, end, block, microbatch)`` of every
      action that occupies it, sorted by start.
  """

  makespan: int
  busy_steps: tuple[int, ...]
  utilisation: tuple[float, ...]
  bubble_ratio: float
  peak_memory: tuple[int, ...]
  memory_timeline: tuple[tuple[tuple[int, int], ...], ...]
  device_timeline: tuple[tuple[tuple[int, int, int, int], ...], ...]

  @property
  def num_devices(self) -> int:
    return len(self.busy_steps)

  def to_dict(self) -> dict[str, Any]:
    """The figures as JSON-able values (lists, ints, floats)."""
    return {
        "makespan": self.makespan,
        "busy_steps": list(self.busy_steps),
        "utilisation": list(self.utilisation),
        "bubble_ratio": self.bubble_ratio,
        "peak_memory": list(self.peak_memory),
        "memory_timeline": [[list(p) for p in tl]
                            for tl in self.memory_timeline],
        "device_timeline": [[list(x) for x in tl]
                            for tl in self.device_timeline],
    }


def simulate(schedule: Any) -> SimulationStats:
  """Replays ``schedule`` and measures it.

  Args:
    schedule: An ``UnrolledSchedule`` (anything with ``graph`` and
      ``actions``).

  Returns:
    The schedule's figures.

  Raises:
    PlacementError: if an action names a block the placement lacks.
  """
  graph = schedule.graph
  nd = graph.num_devices
  makespan = 0
  busy = [0] * nd
  timeline: list[list[tuple[int, int, int, int]]] = [[] for _ in range(nd)]
  deltas: list[dict[int, int]] = [defaultdict(int) for _ in range(nd)]
  for a in schedule.actions:
    block = graph.block(a.block)
    end = a.start + block.span
    makespan = max(makespan, end)
    for d in block.devices:
      busy[d] += block.span
      timeline[d].append((a.start, end, a.block, a.microbatch))
      deltas[d][a.start] += block.memory
  peaks = []
  memory = []
  for d in range(nd):
    level = peak = 0
    points = []
    for t in sorted(deltas[d]):
      if deltas[d][t]:
        level += deltas[d][t]
        points.append((t, level))
        peak = max(peak, level)
    peaks.append(peak)
    memory.append(tuple(points))
  if makespan > 0:
    utilisation = tuple(b / makespan for b in busy)
    bubbles = (nd * makespan - sum(busy)) / (nd * makespan)
  else:
    utilisation = tuple(0.0 for _ in busy)
    bubbles = 0.0
  return SimulationStats(
      makespan=makespan, busy_steps=tuple(busy), utilisation=utilisation,
      bubble_ratio=bubbles, peak_memory=tuple(peaks),
      memory_timeline=tuple(memory),
      device_timeline=tuple(tuple(sorted(tl)) for tl in timeline))


# --- lower bounds ------------------------------------------------------------

def _heads_and_tails(
    graph: BlockGraph) -> tuple[dict[int, int], dict[int, int]]:
  """Longest path to each block's start and from each block's end.

  ``head[b]``: longest chain of spans and delays from a source to the start
  of ``b`` inside one micro-batch; ``tail[b]``: the same from the end of
  ``b`` to the end of a sink.
  """
  span = {b.id: b.span for b in graph.blocks}
  order = graph.topological_order()
  head = {b: 0 for b in order}
  tail = {b: 0 for b in order}
  preds: dict[int, list[tuple[int, int]]] = defaultdict(list)
  succs: dict[int, list[tuple[int, int]]] = defaultdict(list)
  for e in graph.edges:
    preds[e.dst].append((e.src, e.delay))
    succs[e.src].append((e.dst, e.delay))
  for b in order:
    head[b] = max((head[s] + span[s] + dl for s, dl in preds[b]), default=0)
  for b in reversed(order):
    tail[b] = max((dl + span[s] + tail[s] for s, dl in succs[b]), default=0)
  return head, tail


def device_bounds(graph: BlockGraph) -> tuple[tuple[int, int, int], ...]:
  """Per device ``(h_d, W_d, t_d)`` of the makespan bound.

  ``W_d`` is the device's busy steps per micro-batch, ``h_d`` the earliest
  step any of its blocks can start, ``t_d`` the shortest unavoidable tail
  after one of its blocks ends (edge delays included).
  """
  head, tail = _heads_and_tails(graph)
  out = []
  for d in range(graph.num_devices):
    ids = [b.id for b in graph.blocks if d in b.devices]
    out.append((min(head[b] for b in ids),
                sum(graph.block(b).span for b in ids),
                min(tail[b] for b in ids)))
  return tuple(out)


def lower_bound_period(graph: BlockGraph) -> int:
  """Busiest device's total span per micro-batch: no period is shorter."""
  return max(w for _, w, _ in device_bounds(graph))


def critical_path(graph: BlockGraph) -> int:
  """Longest chain of spans and delays through one micro-batch."""
  head, tail = _heads_and_tails(graph)
  return max(head[b.id] + b.span + tail[b.id] for b in graph.blocks)


def lower_bound_makespan(graph: BlockGraph, num_microbatches: int) -> int:
  """A makespan no schedule of ``num_microbatches`` micro-batches beats.

  The bound is ``max_d (h_d + N * W_d + t_d)`` (see ``device_bounds``):
  device ``d`` cannot start before ``h_d``, is busy ``N * W_d`` steps and
  after its last block at least ``t_d`` more steps pass. It is raised to
  ``critical_path + N - 1`` where that is larger (the first block of the
  critical path runs its micro-batches at distinct, increasing steps), which
  matters only for small ``N``.

  Raises:
    ValueError: if ``num_microbatches < 1``.
  """
  n = num_microbatches
  if n < 1:
    raise ValueError(f"lower_bound_makespan needs at least one micro-batch,"
                     f" got {n}")
  per_device = max(h + n * w + t for h, w, t in device_bounds(graph))
  return max(per_device, critical_path(graph) + n - 1)


def _idle_paths(graph: BlockGraph, device: int, reverse: bool) -> dict[int, int]:
  """Longest path into (``reverse``: out of) each block, counting only the
  spans of blocks that do not run on ``device`` (delays count 0)."""
  order = graph.topological_order()
  if reverse:
    order = tuple(reversed(order))
  weight = {b.id: 0 if device in b.devices else b.span for b in graph.blocks}
  best = {b: 0 for b in order}
  for b in order:
    nxt = graph.predecessors(b) if not reverse else graph.successors(b)
    others = [e.src if not reverse else e.dst for e in nxt]
    best[b] = max((best[o] + weight[o] for o in others), default=0)
  return best


def shared_device_bounds(graph: BlockGraph) -> tuple[tuple[int, int, int], ...]:
  """``device_bounds`` tightened for blocks that run on every device.

  A block on every device cannot overlap any other block. Before device
  ``d`` runs its first block that is not on every device, every block not on
  ``d`` on a dependency path into it has run, one after the other, and
  ``d`` was idle meanwhile (it had no work of its own yet and could not run
  a block on every device beside it). So ``d``'s idle time before that
  first block is at least the longest such path (spans of blocks not on
  ``d``), and likewise after its last one. With no block on every device
  this is never tighter than ``device_bounds`` for chains, but it is for
  M-shapes (a chain between shared blocks keeps the end devices idle while
  the first and last micro-batches pass). Returns ``(h_d, W_d, t_d)`` per
  device with each ``h_d`` and ``t_d`` the larger of the two bounds.
  """
  everywhere = {b.id for b in graph.blocks
                if len(b.devices) == graph.num_devices}
  out = []
  for d, (h, w, t) in enumerate(device_bounds(graph)):
    own = [b.id for b in graph.blocks
           if d in b.devices and b.id not in everywhere]
    if own:
      into = _idle_paths(graph, d, reverse=False)
      out_of = _idle_paths(graph, d, reverse=True)
      h = max(h, min(into[b] for b in own))
      t = max(t, min(out_of[b] for b in own))
    out.append((h, w, t))
  return tuple(out)


def lower_bound_makespan_shared(graph: BlockGraph, num_microbatches: int) -> int:
  """``lower_bound_makespan`` with ``shared_device_bounds`` (>= it).

  Raises:
    ValueError: if ``num_microbatches < 1``.
  """
  n = num_microbatches
  base = lower_bound_makespan(graph, n)
  return max(base, max(h + n * w + t for h, w, t in shared_device_bounds(graph)))


def summary(schedule: Any) -> dict[str, Any]:
  """Headline figures of ``schedule`` as a JSON-able dict.

  Keys: placement, source, status, num_devices, num_microbatches, makespan,
  lower_bound_makespan, makespan_over_lower_bound, period,
  lower_bound_period, busy_steps, utilisation, bubble_ratio, peak_memory,
  memory_limit.
  """
  stats = simulate(schedule)
  graph = schedule.graph
  n = int(schedule.num_microbatches)
  lb = lower_bound_makespan(graph, n) if n >= 1 else 0
  return {
      "placement": graph.name,
      "source": getattr(schedule, "source", None),
      "status": getattr(schedule, "status", None),
      "num_devices": graph.num_devices,
      "num_microbatches": n,
      "makespan": stats.makespan,
      "lower_bound_makespan": lb,
      "makespan_over_lower_bound": (round(stats.makespan / lb, 6)
                                    if lb else None),
      "period": getattr(schedule, "period", None),
      "lower_bound_period": lower_bound_period(graph),
      "busy_steps": list(stats.busy_steps),
      "utilisation": [round(u, 6) for u in stats.utilisation],
      "bubble_ratio": round(stats.bubble_ratio, 6),
      "peak_memory": list(stats.peak_memory),
      "memory_limit": getattr(schedule, "memory_limit", None),
  }
