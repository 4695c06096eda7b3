"""The event loop of ``predict.predict_shared``: devices sharing cores.

:func:`device_programs` lists what each device runs, in order (barriers,
its blocks, its per-tick work); :class:`SharedReplay` runs those programs
on a pool of cores, the items running at the same moment sharing them
(:func:`water_fill`). No jax.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

#: One item of a device's program: ``("bar", seconds)`` (a barrier of every
#: device), ``("run", action)`` (a block) or ``("tick", core-seconds)``.
Item = tuple[str, Any]


def water_fill(capacity: float, caps: list[float]) -> list[float]:
  """Equal shares of ``capacity``, none above its cap, leftovers shared."""
  rates = [0.0] * len(caps)
  left, todo = float(capacity), sorted(range(len(caps)), key=lambda i: caps[i])
  while todo:
    share = left / len(todo)
    i = todo[0]
    if caps[i] <= share:
      rates[i] = caps[i]
      left -= caps[i]
      todo.pop(0)
    else:
      for j in todo:
        rates[j] = share
      break
  return rates


def device_programs(by_step: Mapping[int, list[Any]],
                    position: Mapping[int, int],
                    devices: Mapping[int, tuple[int, ...]], nd: int,
                    barriers: Mapping[int, float],
                    cost: Callable[[int], tuple[float, ...]],
                    barriers_after: Mapping[int, float] | None
                    ) -> list[list[Item]]:
  """Each device's items, tick by tick: the barrier before the tick, its
  block, the tick's own work, the barrier after; the barriers after the
  last tick at the end."""
  steps = sorted(by_step)
  last = steps[-1] if steps else 0
  progs: list[list[Item]] = [[] for _ in range(nd)]
  for step in steps:
    bar = barriers.get(step)
    runs: dict[int, Any] = {}
    for a in sorted(by_step[step], key=lambda a: position[a.block]):
      for d in devices[a.block]:
        runs[d] = a
    over = cost(step)
    for d in range(nd):
      if bar is not None:
        progs[d].append(("bar", float(bar)))
      if d in runs:
        progs[d].append(("run", runs[d]))
      if over[d]:
        progs[d].append(("tick", over[d]))
      if step in (barriers_after or {}):
        progs[d].append(("bar", float(barriers_after[step])))
  final = sum(float(v) for k, v in barriers.items() if k > last)
  if final:
    for d in range(nd):
      progs[d].append(("bar", final))
  return progs


class SharedReplay:
  """Runs device programs on ``cores`` shared cores (mutable: the clock).

  Attributes:
    now: Seconds since the start.
    busy: Per device, seconds it ran blocks.
    starts: ``(block, micro-batch)`` -> when its first device started it.
    ends: ``(block, micro-batch)`` -> when its last device finished it.
  """

  def __init__(self, progs: list[list[Item]], work: Mapping[int, float],
               parallelism: Mapping[int, float], cores: float,
               devices: Mapping[int, tuple[int, ...]],
               into: Mapping[int, list[Any]],
               delays: Mapping[tuple[int, int], float]):
    self.progs, self.work, self.parallelism = progs, work, parallelism
    self.cores, self.devices, self.into, self.delays = (cores, devices,
                                                         into, delays)
    nd = len(progs)
    self.nd = nd
    self.now = 0.0
    self.pos = [0] * nd
    self.left: list[float | None] = [None] * nd   # remaining core-seconds
    self.busy = [0.0] * nd
    self.starts: dict[tuple[int, int], float] = {}
    self.ends: dict[tuple[int, int], float] = {}
    self.parts: dict[tuple[int, int], int] = {}   # devices still running
    self.began: dict[int, float] = {}

  def run(self) -> float:
    """Runs every program to its end; returns the step's seconds.

    Raises:
      ValueError: if the device orders deadlock (an invalid schedule).
    """
    while True:
      waits = self._start_ready()
      done = [self.pos[d] >= len(self.progs[d]) for d in range(self.nd)]
      if all(done):
        return self.now
      if not self._pass_barrier(done):
        self._advance(waits)

  def _ready_time(self, a: Any) -> float | None:
    """When ``a``'s inputs are there (None: a producer is not done)."""
    t = 0.0
    for e in self.into[a.block]:
      src = (e.src, a.microbatch)
      if src not in self.ends:
        return None
      t = max(t, self.ends[src] + float(self.delays.get((e.src, e.dst), 0.0)))
    return t

  def _start_ready(self) -> list[float]:
    """Starts every idle device's next block (inputs there) or tick work;
    returns when the blocks waiting on inputs in flight can start."""
    waits: list[float] = []
    for d in range(self.nd):
      if self.pos[d] >= len(self.progs[d]) or self.left[d] is not None:
        continue
      kind, val = self.progs[d][self.pos[d]]
      if kind == "run":
        t = self._ready_time(val)
        if t is None:
          continue
        if t > self.now + 1e-15:
          waits.append(t)
          continue
        self.left[d] = float(self.work[val.block])
        self.began[d] = self.now
        key = (val.block, val.microbatch)
        self.starts[key] = min(self.starts.get(key, self.now), self.now)
      elif kind == "tick":
        self.left[d] = val
    return waits

  def _pass_barrier(self, done: list[bool]) -> bool:
    """Where every device not done is at a barrier: all pass it (the
    longest's seconds). Returns whether they did."""
    at_bar = [not done[d] and self.progs[d][self.pos[d]][0] == "bar"
              for d in range(self.nd)]
    if not all(b or f for b, f in zip(at_bar, done)):
      return False
    self.now += max(self.progs[d][self.pos[d]][1] for d in range(self.nd)
                    if at_bar[d])
    for d in range(self.nd):
      if at_bar[d]:
        self.pos[d] += 1
    return True

  def _rates(self, running: list[int]) -> dict[int, float]:
    """Cores each running item gets (a block at most its parallelism, a
    tick's work one)."""
    caps = []
    for d in running:
      kind, val = self.progs[d][self.pos[d]]
      caps.append(max(1.0, float(self.parallelism.get(val.block, 1.0)))
                  if kind == "run" else 1.0)
    return dict(zip(running, water_fill(self.cores, caps)))

  def _advance(self, waits: list[float]) -> None:
    """Moves the clock to the next event (an item's end or a block's
    inputs arriving) and finishes the items that end there."""
    running = [d for d in range(self.nd) if self.left[d] is not None]
    rates = self._rates(running)
    events = [self.now + self.left[d] / rates[d] for d in running
              if rates[d] > 0]
    events += waits
    if not events:
      raise ValueError("the device orders deadlock: every device waits for"
                       " a block that never runs; the schedule is invalid")
    dt = max(0.0, min(events) - self.now)
    self.now += dt
    for d in running:
      self.left[d] -= rates[d] * dt
      if self.left[d] <= 1e-12:
        self._finish(d)

  def _finish(self, d: int) -> None:
    """Device ``d``'s item ends now (a block ends once every device's share
    is done)."""
    kind, val = self.progs[d][self.pos[d]]
    if kind == "run":
      key = (val.block, val.microbatch)
      self.parts[key] = self.parts.get(key, len(self.devices[val.block])) - 1
      if self.parts[key] == 0:  # every device's share is done
        self.ends[key] = self.now
      self.busy[d] += self.now - self.began[d]
    self.left[d] = None
    self.pos[d] += 1
