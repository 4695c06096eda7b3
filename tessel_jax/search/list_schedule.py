"""Memory-aware list scheduling of all N micro-batches (no repetend).

A repetend pays a fill and drain that grow with its latency; with a loose
memory limit the best schedule for a *given* ``N`` is often not periodic
(GPipe's "all forwards first" has no bounded repetend at all). This module
times every action of ``N`` micro-batches greedily, step by step (the
*parallel* schedule-generation scheme):

* an action is *ready* when its dependencies have ended (plus edge delays)
  and the same block of the previous micro-batch has started;
* at each step, ready actions are taken in priority order when all their
  devices are idle and, for a block that adds memory, the level of each of
  its devices stays within the limit;
* priorities: ``"tail"`` the longest path from the block to the end of its
  micro-batch first (critical-path list scheduling: GPipe-like while memory
  lasts), ``"wide"`` blocks on more devices first, then ``"tail"`` (a block
  on every device pauses all of them at once, which costs no idle time in
  a full pipeline; waiting for all of them to drain does), ``"microbatch"``
  the oldest micro-batch first (1F1B-like).

``list_schedule`` returns None when the memory limit stops every device (the
greedy choice filled memory with work it cannot finish); the repetend is
then the answer. ``best_list_schedule`` adds a serial pass in micro-batch
order, improves each schedule by forward-backward justification
(``list_improve``) and keeps the shortest.
The search offers it next to the repetend's unrolling and ``Schedule.unroll``
keeps the shorter (both are checked by the validator in the tests). Pure
Python: no ortools, no jax.
"""

from __future__ import annotations

import heapq

from tessel_jax import simulate
from tessel_jax.graph import BlockGraph
from tessel_jax.schedule import Action
from tessel_jax.search import list_improve
from tessel_jax.search.list_improve import Instance

PRIORITIES = ("tail", "wide", "microbatch")


def tails(graph: BlockGraph) -> dict[int, int]:
  """Per block: the longest path from its start to its micro-batch's end."""
  tail: dict[int, int] = {}
  for bid in reversed(graph.topological_order()):
    after = [e.delay + tail[e.dst] for e in graph.successors(bid)]
    tail[bid] = graph.block(bid).span + max(after, default=0)
  return tail


def _priorities(graph: BlockGraph, n: int, rule: str,
                tail: dict[int, int] | None = None) -> list[int]:
  """Rank per action ``k = i * n + j`` (lower first; all distinct)."""
  nb = graph.num_blocks
  tail = tails(graph) if tail is None else tail
  most = max(tail.values())
  lag = [most - tail[b.id] for b in graph.blocks]  # >= 0, critical first
  if rule == "tail":
    major = lag
  elif rule == "wide":
    major = [(graph.num_devices - len(b.devices)) * (most + 1) + lag[i]
             for i, b in enumerate(graph.blocks)]
  elif rule == "microbatch":
    return [(j * (most + 1) + lag[i]) * nb + i
            for i in range(nb) for j in range(n)]
  else:
    raise ValueError(f"unknown list-scheduling priority {rule!r}; use one of"
                     f" {PRIORITIES}")
  return [(major[i] * n + j) * nb + i for i in range(nb) for j in range(n)]


def parallel_schedule(inst: Instance, priority: list[int],
                      memory_limit: int | None) -> list[int] | None:
  """Step-by-step greedy schedule (start per action ``k``) or None if stuck.

  Args:
    inst: The problem in index form.
    priority: Rank per action (lower first).
    memory_limit: Per-device limit (None: unlimited).
  """
  n, span, devices, memory, succ = (inst.n, inst.span, inst.devices,
                                    inst.memory, inst.succ)
  limit = inst.binding_limit(memory_limit)
  num_devices = inst.num_devices
  waiting = [c for c in inst.num_preds for _ in range(n)]
  earliest = [0] * inst.size
  starts = [0] * inst.size
  nxt = [0] * len(span)  # next micro-batch per block
  pending = [(0, i) for i, c in enumerate(inst.num_preds) if c == 0]
  heapq.heapify(pending)  # (earliest step, block) of blocks soon ready
  ready_on: list[list[int]] = [[] for _ in range(num_devices)]
  busy = [0] * num_devices
  level = [0] * num_devices
  left = inst.size
  now = 0
  while True:
    while pending and pending[0][0] <= now:
      i = heapq.heappop(pending)[1]
      for d in devices[i]:
        ready_on[d].append(i)
    ready = set()
    for d in range(num_devices):
      if busy[d] <= now and ready_on[d]:
        ready.update(ready_on[d])
    for i in sorted(ready, key=lambda b: priority[b * n + nxt[b]]):
      ds, m = devices[i], memory[i]
      if any(busy[d] > now for d in ds):
        continue
      if limit is not None and m > 0 and any(level[d] + m > limit
                                             for d in ds):
        continue
      j = nxt[i]
      k = i * n + j
      starts[k] = now
      left -= 1
      end = now + span[i]
      for d in ds:
        busy[d] = end
        level[d] += m
        ready_on[d].remove(i)
      for dst, delay in succ[i]:
        kd = dst * n + j
        waiting[kd] -= 1
        if end + delay > earliest[kd]:
          earliest[kd] = end + delay
        if waiting[kd] == 0 and nxt[dst] == j:
          heapq.heappush(pending, (earliest[kd], dst))
      nxt[i] = j + 1
      if j + 1 < n:
        earliest[k + 1] = max(earliest[k + 1], now + 1)
        if waiting[k + 1] == 0:
          heapq.heappush(pending, (earliest[k + 1], i))
    if not left:
      return starts
    later = [b for b in busy if b > now]
    if pending:
      later.append(pending[0][0])
    if not later:
      return None  # every ready action waits for memory that never frees
    now = min(later)


def _actions(inst: Instance, starts: list[int]) -> tuple[Action, ...]:
  n = inst.n
  rows = sorted((t, inst.ids[k // n], k % n) for k, t in enumerate(starts))
  return tuple(Action(*row) for row in rows)


def list_schedule(graph: BlockGraph, num_microbatches: int,
                  memory_limit: int | None, rule: str = "tail",
                  ) -> tuple[Action, ...] | None:
  """Greedy schedule of ``num_microbatches`` micro-batches, or None if stuck.

  Args:
    graph: The placement.
    num_microbatches: ``N``.
    memory_limit: Per-device limit (None: unlimited).
    rule: One of ``PRIORITIES`` (see the module docstring).

  Returns:
    Every action, sorted by start; None if the memory limit blocks progress.
  """
  priority = _priorities(graph, num_microbatches, rule)
  inst = Instance(graph, num_microbatches)
  starts = parallel_schedule(inst, priority, memory_limit)
  return None if starts is None else _actions(inst, starts)


#: Largest time horizon (steps) the list schedulers index per device
#: (one byte per step and device, plus a memory tree); beyond it
#: ``best_list_schedule`` gives up (returns None) and ``Schedule.unroll``
#: keeps the repetend's unrolling.
MAX_HORIZON = 2 * 10**7


def best_list_schedule(graph: BlockGraph, num_microbatches: int,
                       memory_limit: int | None, improve: bool = True,
                       ) -> tuple[Action, ...] | None:
  """The shortest of several greedy schedules, each justified.

  Tries every rule of ``PRIORITIES`` (``"wide"`` only where blocks differ in
  their number of devices) with the step-by-step scheme, then the
  ``"microbatch"`` order with the serial scheme (each action at its
  earliest feasible step, gaps included: 1F1B-like with the fill filled);
  each result is improved by ``list_improve.improve``. Stops early at the
  lower bound ``simulate.lower_bound_makespan_shared``.

  Args:
    graph: The placement.
    num_microbatches: ``N``.
    memory_limit: Per-device limit (None: unlimited).
    improve: Run forward-backward improvement on each schedule.

  Returns:
    Every action, sorted by start; None if the limit stops every try or
    the horizon ``N x (spans + delays)`` exceeds ``MAX_HORIZON`` steps.
  """
  n = num_microbatches
  if n * (sum(b.span + 1 for b in graph.blocks)
          + sum(e.delay for e in graph.edges)) > MAX_HORIZON:
    return None  # time-indexed tables would not fit: no list schedule
  inst = Instance(graph, n)
  bound = simulate.lower_bound_makespan_shared(graph, n)
  widths = {len(b.devices) for b in graph.blocks}
  tries = [(rule, False) for rule in PRIORITIES
           if rule != "wide" or len(widths) > 1] + [("microbatch", True)]
  tail = tails(graph)
  best, best_end = None, None
  for rule, serial in tries:
    priority = _priorities(graph, n, rule, tail)
    if serial:
      order = sorted(range(inst.size), key=priority.__getitem__)
      starts = list_improve.serial_schedule(inst, order, memory_limit)
    else:
      starts = parallel_schedule(inst, priority, memory_limit)
    if starts is None:
      continue
    if improve and inst.makespan(starts) > bound:
      starts = list_improve.improve(graph, n, memory_limit, starts)
    end = inst.makespan(starts)
    if best_end is None or end < best_end:
      best, best_end = starts, end
    if best_end <= bound:
      break
  return None if best is None else _actions(inst, best)
