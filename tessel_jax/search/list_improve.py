"""Forward-backward improvement (justification) of a list schedule.

A greedy list schedule (``list_schedule``) often leaves a fill or drain that
a better order would hide. Justification, the classic improvement of
resource-constrained project scheduling (RCPSP), reorders it without a
search:

1. *backward pass*: schedule the reversed problem (every edge turned round,
   micro-batches in reverse order, time running backwards) with the *serial*
   schedule-generation scheme, taking actions latest-ending first. This
   pushes every action as late as the others allow ("right-justifies");
2. *forward pass*: schedule the real problem again, taking actions in the
   order of their backward start times, each at its earliest feasible step.

Both passes place actions one at a time at the earliest step where their
dependencies have ended and all their devices are free (gaps left earlier
are filled: the serial scheme), so without a memory limit neither pass
makes the makespan longer than the schedule it came from. Only the forward
pass checks the memory limit (the backward pass only derives an order); a
forward pass that the limit stops (None) ends the improvement with the best
earlier schedule. Rounds repeat while the makespan shrinks.

Actions are numbered ``k = i * N + j`` (block position ``i`` in
``graph.blocks``, micro-batch ``j``); a schedule is the list of start steps
indexed by ``k``. Pure Python, deterministic (ties keep the earlier order).
"""

from __future__ import annotations

from tessel_jax.graph import BlockGraph


class Instance:
  """Index form of ``graph`` for ``n`` micro-batches (edges maybe reversed).

  Attributes:
    n: Number of micro-batches.
    ids: Block id per position ``i``.
    span, memory, devices: Per position ``i``.
    succ: Per position ``i``: ``(position, delay)`` of its successors (the
      predecessors when ``reverse``).
    num_preds: Per position ``i``: the number of its predecessors.
    num_devices: Devices of the graph.
  """

  def __init__(self, graph: BlockGraph, n: int, reverse: bool = False):
    pos = {b.id: i for i, b in enumerate(graph.blocks)}
    self.n = n
    self.ids = [b.id for b in graph.blocks]
    self.span = [b.span for b in graph.blocks]
    self.memory = [b.memory for b in graph.blocks]
    self.devices = [b.devices for b in graph.blocks]
    self.num_devices = graph.num_devices
    self.succ: list[list[tuple[int, int]]] = [[] for _ in graph.blocks]
    self.num_preds = [0] * len(graph.blocks)
    for e in graph.edges:
      src, dst = pos[e.src], pos[e.dst]
      if reverse:
        src, dst = dst, src
      self.succ[src].append((dst, e.delay))
      self.num_preds[dst] += 1

  @property
  def size(self) -> int:
    """Number of actions ``len(span) * n``."""
    return len(self.span) * self.n

  def makespan(self, starts: list[int]) -> int:
    """End of the last action of the schedule ``starts``."""
    n = self.n
    return max(starts[(i + 1) * n - 1] + s for i, s in enumerate(self.span))

  def binding_limit(self, memory_limit: int | None) -> int | None:
    """``memory_limit``, or None where no schedule can exceed it."""
    if memory_limit is None:
      return None
    most = [0] * self.num_devices
    for m, ds in zip(self.memory, self.devices):
      for d in ds:
        most[d] += max(m, 0) * self.n
    return memory_limit if max(most) > memory_limit else None


def serial_schedule(inst: Instance, order: list[int],
                    memory_limit: int | None) -> list[int] | None:
  """Serial schedule generation: each action at its earliest feasible step.

  Args:
    inst: The (maybe reversed) problem.
    order: Every action ``k`` once, each after its predecessors and after
      the previous micro-batch of its block.
    memory_limit: Per-device limit (None: unchecked).

  Returns:
    The start step per action; None if the limit leaves an action no step.
  """
  n, span, devices, succ = inst.n, inst.span, inst.devices, inst.succ
  limit = inst.binding_limit(memory_limit)
  in_delay = [0] * len(span)
  for out in succ:
    for dst, delay in out:
      in_delay[dst] = max(in_delay[dst], delay)
  horizon = n * sum(s + d + 1 for s, d in zip(span, in_delay)) + max(span)
  busy = [bytearray(horizon) for _ in range(inst.num_devices)]
  # Patterns only for the spans that occur (a table for every length up
  # to the longest span is quadratic in it).
  free = {s: bytes(s) for s in set(span)}
  full = {s: b"\x01" * s for s in set(span)}
  levels = ([_Levels() for _ in range(inst.num_devices)]
            if limit is not None else [])
  earliest = [0] * inst.size
  starts = [0] * inst.size
  for k in order:
    i, j = divmod(k, n)
    s, ds = span[i], devices[i]
    t = earliest[k]
    if len(ds) == 1 and (limit is None or inst.memory[i] <= 0):
      t = busy[ds[0]].find(free[s], t)
    else:
      t = _fit(busy, levels, ds, free[s], t, inst.memory[i], limit)
      if t is None:
        return None
    for d in ds:
      busy[d][t:t + s] = full[s]
    if limit is not None and inst.memory[i]:
      for d in ds:
        levels[d].add(t, inst.memory[i])
    starts[k] = t
    end = t + s
    for dst, delay in succ[i]:
      kd = dst * n + j
      if end + delay > earliest[kd]:
        earliest[kd] = end + delay
    if j + 1 < n and earliest[k + 1] <= t:
      earliest[k + 1] = t + 1
  return starts


def _fit(busy: list[bytearray], levels: list[_Levels], ds: tuple[int, ...],
         free: bytes, t: int, memory: int, limit: int | None) -> int | None:
  """Earliest step >= ``t`` with all of ``ds`` free and memory to spare."""
  if limit is not None and memory > 0:
    room = limit - memory  # fits at every step after the last one above
    for d in ds:
      if levels[d].final > room:
        return None  # the level never drops to what the block needs
      t = max(t, levels[d].last_above(room) + 1)
  while True:
    start = t
    for d in ds:
      t = busy[d].find(free, t)
    if t == start:
      return t


class _Levels:
  """One device's memory level per step under insertions of memory deltas.

  A segment tree over steps: each node keeps the sum of the deltas in its
  range and the largest running sum (prefix) inside it, so a delta at any
  step and the question "last step whose level exceeds x" each take
  O(log steps), wherever in time the serial scheme places the block.
  """

  def __init__(self, size: int = 1024):
    self.size = size
    self.sums = [0] * (2 * size)
    self.peaks = [0] * (2 * size)

  @property
  def final(self) -> int:
    """Level after the last delta (it stays there)."""
    return self.sums[1]

  def add(self, step: int, delta: int) -> None:
    """Adds ``delta`` to the level from ``step`` on."""
    while step >= self.size:
      self._grow()
    sums, peaks = self.sums, self.peaks
    p = step + self.size
    sums[p] += delta
    peaks[p] = sums[p]
    p >>= 1
    while p:
      left = 2 * p
      sums[p] = sums[left] + sums[left + 1]
      peak = sums[left] + peaks[left + 1]
      peaks[p] = peak if peak > peaks[left] else peaks[left]
      p >>= 1

  def last_above(self, value: int) -> int:
    """Last step whose level exceeds ``value``; -1 if none."""
    sums, peaks = self.sums, self.peaks
    if peaks[1] <= value:
      return -1
    p, before = 1, 0
    while p < self.size:
      left = 2 * p
      if before + sums[left] + peaks[left + 1] > value:
        before += sums[left]
        p = left + 1
      else:
        p = left
    return p - self.size

  def _grow(self) -> None:
    """Doubles the steps covered: the old tree becomes the left half."""
    size = self.size
    sums, peaks = [0] * (4 * size), [0] * (4 * size)
    width = 1
    while width <= size:  # depth by depth, each level's nodes move right
      sums[2 * width:3 * width] = self.sums[width:2 * width]
      peaks[2 * width:3 * width] = self.peaks[width:2 * width]
      width *= 2
    sums[1], peaks[1] = sums[2], max(peaks[2], sums[2])
    self.size, self.sums, self.peaks = 2 * size, sums, peaks


def improve(graph: BlockGraph, n: int, memory_limit: int | None,
            starts: list[int], rounds: int = 4) -> list[int]:
  """Forward-backward improvement of the schedule ``starts``.

  Args:
    graph: The placement.
    n: Number of micro-batches.
    memory_limit: Per-device limit the forward passes keep (None: none).
    starts: A valid schedule (start per action ``k = i * n + j``).
    rounds: Most backward-forward rounds.

  Returns:
    The shortest schedule found (``starts`` itself when none is shorter).
  """
  fwd = Instance(graph, n)
  bwd = Instance(graph, n, reverse=True)
  span_of = [s for s in fwd.span for _ in range(n)]
  # Action k of the real problem is action mirror[k] of the reversed one.
  mirror = [i * n + n - 1 - j for i in range(len(fwd.span)) for j in range(n)]
  best, best_end = starts, fwd.makespan(starts)
  order = sorted(range(fwd.size), key=starts.__getitem__)
  for _ in range(rounds):
    ends = [s + p for s, p in zip(best, span_of)]
    back_order = sorted(reversed(order), key=ends.__getitem__, reverse=True)
    back = serial_schedule(bwd, [mirror[k] for k in back_order], None)
    horizon = bwd.makespan(back)
    # Real start of k in the backward schedule: horizon - end in reverse.
    key = [horizon - back[mirror[k]] - span_of[k] for k in range(fwd.size)]
    order = sorted(order, key=key.__getitem__)
    found = serial_schedule(fwd, order, memory_limit)
    if found is None:
      break
    end = fwd.makespan(found)
    if end >= best_end:
      break
    best, best_end = found, end
    order = sorted(range(fwd.size), key=found.__getitem__)
  return best
