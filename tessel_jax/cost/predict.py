"""Step time, peak memory and bubbles of a schedule in real units (no jax).

:func:`predict` replays an ``UnrolledSchedule`` with the measured seconds of
its blocks instead of their integer spans. Every device keeps its order of
blocks (the order the lowered program runs them in: ticks in increasing
step, DESIGN §5), and a block starts when its devices are free and its
inputs have arrived (end of the producer + the edge's delay seconds).

Two things the lowering does per *tick* (a step at which some block starts;
every device runs every tick, idle or not) can be added:

* ``tick_seconds``: the fixed cost of a tick on every device (stash reads
  and writes, the branch switch, idle branches' zero outputs, gradient
  accumulation), measured by ``passes``-level microbenchmarks in the caller;
* ``barriers``: steps before which all devices synchronise, with the
  seconds the synchronisation itself takes. On backends where a collective
  is a rendezvous of every device (XLA's CPU runtime), each tick that
  receives messages from other devices starts with such a barrier.

Peak memory is the running sum of the blocks' real byte deltas per device,
in each device's order (the same order as the integer schedule, so the
same peaks up to the unit rounding).

:func:`predict_shared` is the same replay for devices that share a pool of
cores (the fake devices of XLA's CPU backend all run in one process): each
block has a *work* in core-seconds and a largest number of cores it can use
(its parallelism, measured alone); the blocks running at the same moment
share the cores (each gets an equal share, never more than it can use, the
rest going to the others), so a block runs faster while the other devices
idle.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any

from tessel_jax.cost import core_sharing as _core_sharing


@dataclasses.dataclass(frozen=True)
class Prediction:
  """A schedule's figures in seconds and bytes.

  Attributes:
    step_seconds: Predicted wall time of one step (end of the last block,
      plus the last tick's overhead).
    busy_seconds: Per device, seconds spent running blocks.
    bubble_ratio: Idle device-seconds over ``devices * step_seconds``.
    peak_bytes: Per device, the largest running sum of block memory bytes.
    starts: ``(block, micro-batch) -> start seconds``.
    ends: ``(block, micro-batch) -> end seconds``.
    ticks: Ticks replayed (distinct integer start steps).
  """

  step_seconds: float
  busy_seconds: tuple[float, ...]
  bubble_ratio: float
  peak_bytes: tuple[int, ...]
  starts: Mapping[tuple[int, int], float]
  ends: Mapping[tuple[int, int], float]
  ticks: int

  def to_dict(self) -> dict[str, Any]:
    return {"step_seconds": self.step_seconds,
            "busy_seconds": list(self.busy_seconds),
            "bubble_ratio": self.bubble_ratio,
            "peak_bytes": list(self.peak_bytes), "ticks": self.ticks}


def _replay_inputs(unrolled: Any, delays: Any, barriers: Any,
                   tick_seconds: float | Callable[[int], Any]) -> tuple:
  """What both replays need: graph, device count, block positions and
  devices, edges into each block, delays, barriers, the per-tick cost as a
  function of the step, and the actions grouped by start step."""
  graph = unrolled.graph
  position = {b.id: i for i, b in enumerate(graph.blocks)}
  devices = {b.id: tuple(b.devices) for b in graph.blocks}
  into: dict[int, list[Any]] = {b.id: [] for b in graph.blocks}
  for e in graph.edges:
    into[e.dst].append(e)
  nd = graph.num_devices
  per_step = tick_seconds if callable(tick_seconds) else (
      lambda _step, c=float(tick_seconds): c)

  def cost(step: int) -> tuple[float, ...]:
    c = per_step(step)
    if isinstance(c, (int, float)):
      return (float(c),) * nd
    return tuple(float(v) for v in c)
  by_step: dict[int, list[Any]] = {}
  for a in unrolled.actions:
    by_step.setdefault(a.start, []).append(a)
  return (graph, nd, position, devices, into, delays or {},
          barriers or {}, cost, by_step)


def predict(unrolled: Any, seconds: Mapping[int, float], *,
            delays: Mapping[tuple[int, int], float] | None = None,
            memory_bytes: Mapping[int, int] | None = None,
            barriers: Mapping[int, float] | None = None,
            tick_seconds: float | Callable[[int], Any] = 0.0,
            barriers_after: Mapping[int, float] | None = None
            ) -> Prediction:
  """Replays ``unrolled`` with real durations.

  Args:
    unrolled: An ``UnrolledSchedule`` (its integer starts give each device's
      order and the ticks).
    seconds: Block id -> seconds.
    delays: ``(src, dst)`` -> seconds after the end of ``src`` before
      ``dst`` may start (default: none).
    memory_bytes: Block id -> bytes added to each of its devices at start.
    barriers: Integer step -> seconds of an all-device synchronisation
      before the tick at that step (steps after the last tick: at the end).
    tick_seconds: Per-tick cost on every device (a number, or a function of
      the tick's step giving a number or one figure per device).
    barriers_after: Integer step -> seconds of an all-device
      synchronisation right after the tick at that step.

  Raises:
    KeyError: if a block of the schedule has no seconds.
  """
  graph, nd, position, devices, into, delays, barriers, cost, by_step = (
      _replay_inputs(unrolled, delays, barriers, tick_seconds))
  mem = memory_bytes or {}
  clock = [0.0] * nd
  busy = [0.0] * nd
  starts: dict[tuple[int, int], float] = {}
  ends: dict[tuple[int, int], float] = {}
  prev_start: dict[int, float] = {}
  for step in sorted(by_step):
    if step in barriers:
      t = max(clock) + float(barriers[step])
      clock = [t] * nd
    for a in sorted(by_step[step], key=lambda a: position[a.block]):
      devs = devices[a.block]
      ready = max(clock[d] for d in devs)
      for e in into[a.block]:
        src = (e.src, a.microbatch)
        if src in ends:
          ready = max(ready, ends[src] + float(delays.get((e.src, e.dst),
                                                          0.0)))
      ready = max(ready, prev_start.get(a.block, 0.0))
      dur = float(seconds[a.block])
      starts[(a.block, a.microbatch)] = ready
      ends[(a.block, a.microbatch)] = ready + dur
      prev_start[a.block] = ready
      for d in devs:
        clock[d] = ready + dur
        busy[d] += dur
    clock = [c + o for c, o in zip(clock, cost(step))]
    if step in (barriers_after or {}):
      t = max(clock) + float(barriers_after[step])
      clock = [t] * nd
  last = max(by_step, default=0)
  final = sum(float(s) for st, s in barriers.items() if st > last)
  step_s = max(clock) + final if by_step else 0.0
  bubbles = (1.0 - sum(busy) / (nd * step_s)) if step_s > 0 else 0.0
  return Prediction(step_seconds=step_s, busy_seconds=tuple(busy),
                    bubble_ratio=max(0.0, bubbles),
                    peak_bytes=_peaks(unrolled, mem),
                    starts=starts, ends=ends, ticks=len(by_step))


def predict_shared(unrolled: Any, work: Mapping[int, float],
                   parallelism: Mapping[int, float], cores: float, *,
                   delays: Mapping[tuple[int, int], float] | None = None,
                   memory_bytes: Mapping[int, int] | None = None,
                   barriers: Mapping[int, float] | None = None,
                   tick_seconds: float | Callable[[int], Any] = 0.0,
                   barriers_after: Mapping[int, float] | None = None
                   ) -> Prediction:
  """Replays ``unrolled`` on devices sharing ``cores`` cores.

  Every device runs its ticks in order: at a tick, its block (if any) once
  the block's inputs have arrived (end of the producer + the edge's delay),
  then the tick's own work (``tick_seconds`` of one core: stash traffic,
  idle branches, gradient accumulation compete for the cores like the
  blocks). Running items share the cores: each gets an equal share, at
  most its parallelism (ticks: 1), leftovers going to the others. A barrier
  before a tick waits for every device and then takes its seconds.

  Args:
    unrolled: An ``UnrolledSchedule``.
    work: Block id -> core-seconds of one run on one device.
    parallelism: Block id -> most cores the block can use (>= 1).
    cores: Cores shared by all devices.
    delays: ``(src, dst)`` -> seconds between the end of ``src`` and the
      start of ``dst``.
    memory_bytes: Block id -> bytes added at its start.
    barriers: Integer step -> seconds of an all-device synchronisation
      before that tick (steps after the last tick: at the end).
    tick_seconds: Per-tick work on every device, seconds on one core
      (number, or function of the step giving a number or one figure per
      device).
    barriers_after: Integer step -> seconds of an all-device
      synchronisation right after the tick at that step.

  Raises:
    ValueError: if the device orders deadlock (an invalid schedule).
  """
  _, nd, position, devices, into, delays, barriers, cost, by_step = (
      _replay_inputs(unrolled, delays, barriers, tick_seconds))
  progs = _core_sharing.device_programs(by_step, position, devices, nd,
                                        barriers, cost, barriers_after)
  replay = _core_sharing.SharedReplay(progs, work, parallelism, cores,
                                      devices, into, delays)
  step_s = replay.run()
  busy = replay.busy
  bubbles = (1.0 - sum(busy) / (nd * step_s)) if step_s > 0 else 0.0
  return Prediction(step_seconds=step_s, busy_seconds=tuple(busy),
                    bubble_ratio=max(0.0, bubbles),
                    peak_bytes=_peaks(unrolled, memory_bytes or {}),
                    starts=replay.starts, ends=replay.ends,
                    ticks=len(by_step))


def _peaks(unrolled: Any, mem: Mapping[int, int]) -> tuple[int, ...]:
  graph = unrolled.graph
  position = {b.id: i for i, b in enumerate(graph.blocks)}
  level = [0] * graph.num_devices
  peak = [0] * graph.num_devices
  for a in sorted(unrolled.actions,
                  key=lambda a: (a.start, position[a.block])):
    m = int(mem.get(a.block, 0))
    for d in graph.block(a.block).devices:
      level[d] += m
      peak[d] = max(peak[d], level[d])
  return tuple(peak)


def makespan_seconds(unrolled: Any, seconds: Mapping[int, float],
                     delays: Mapping[tuple[int, int], float] | None = None
                     ) -> float:
  """End of the last block with real durations and delays (device orders
  kept, no per-tick costs): the reference of the quantisation error."""
  return predict(unrolled, seconds, delays=delays).step_seconds
