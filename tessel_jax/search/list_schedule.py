"""Memory-aware list scheduling of all N micro-batches (no repetend).

A repetend pays a fill and drain that grow with its latency; with a loose
memory limit the best schedule for a *given* ``N`` is often not periodic
(GPipe's "all forwards first" has no bounded repetend at all). This module
times every action of ``N`` micro-batches greedily, step by step:

* an action is *ready* when its dependencies have ended (plus edge delays)
  and the same block of the previous micro-batch has started;
* at each step, ready actions are taken in priority order when all their
  devices are idle and, for a block that adds memory, the level of each of
  its devices stays within the limit;
* priorities: ``"tail"`` the longest path from the block to the end of its
  micro-batch first (critical-path list scheduling: GPipe-like while memory
  lasts), ``"microbatch"`` the oldest micro-batch first (1F1B-like).

It returns None when the memory limit stops every device (the greedy choice
filled memory with work it cannot finish); the repetend is then the answer.
The search offers the result next to the repetend's unrolling and
``Schedule.unroll`` keeps the shorter (both are checked by the validator in
the tests). Pure Python: no ortools, no jax.
"""

from __future__ import annotations

from collections.abc import Callable

from tessel_jax.graph import BlockGraph
from tessel_jax.schedule import Action

PRIORITIES = ("tail", "microbatch")


def tails(graph: BlockGraph) -> dict[int, int]:
  """Per block: the longest path from its start to its micro-batch's end."""
  tail: dict[int, int] = {}
  for bid in reversed(graph.topological_order()):
    after = [e.delay + tail[e.dst] for e in graph.successors(bid)]
    tail[bid] = graph.block(bid).span + max(after, default=0)
  return tail


def _priority(graph: BlockGraph, rule: str) -> Callable[[tuple[int, int]], tuple]:
  position = {b.id: i for i, b in enumerate(graph.blocks)}
  tail = tails(graph)
  if rule == "tail":
    return lambda key: (-tail[key[0]], key[1], position[key[0]])
  if rule == "microbatch":
    return lambda key: (key[1], -tail[key[0]], position[key[0]])
  raise ValueError(f"unknown list-scheduling priority {rule!r}; use one of"
                   f" {PRIORITIES}")


def list_schedule(graph: BlockGraph, num_microbatches: int,
                  memory_limit: int | None, rule: str = "tail",
                  ) -> tuple[Action, ...] | None:
  """Greedy schedule of ``num_microbatches`` micro-batches, or None if stuck.

  Args:
    graph: The placement.
    num_microbatches: ``N``.
    memory_limit: Per-device limit (None: unlimited).
    rule: ``"tail"`` or ``"microbatch"`` (see the module docstring).

  Returns:
    Every action, sorted by start; None if the memory limit blocks progress.
  """
  n = num_microbatches
  priority = _priority(graph, rule)
  blocks = {b.id: b for b in graph.blocks}
  waiting = {(b.id, j): len(graph.predecessors(b.id))
             for b in graph.blocks for j in range(n)}
  earliest: dict[tuple[int, int], int] = {}
  last_started = {b.id: -1 for b in graph.blocks}
  candidates = {(b.id, 0) for b in graph.blocks if not graph.predecessors(b.id)}
  for key in candidates:
    earliest[key] = 0
  busy_until = [0] * graph.num_devices
  level = [0] * graph.num_devices
  actions: list[Action] = []
  total = n * graph.num_blocks
  now = 0
  while len(actions) < total:
    for key in sorted((k for k in candidates if earliest[k] <= now),
                      key=priority):
      block = blocks[key[0]]
      if any(busy_until[d] > now for d in block.devices):
        continue
      if (memory_limit is not None and block.memory > 0 and
          any(level[d] + block.memory > memory_limit for d in block.devices)):
        continue
      _start(graph, block, key, now, n, actions, candidates, waiting,
             earliest, last_started, busy_until, level)
    if len(actions) == total:
      break
    later = [t for t in busy_until if t > now]
    later += [earliest[k] for k in candidates if earliest[k] > now]
    if not later:
      return None  # every ready action waits for memory that never frees
    now = min(later)
  return tuple(sorted(actions))


def _start(graph: BlockGraph, block, key: tuple[int, int], now: int, n: int,
           actions: list[Action], candidates: set, waiting: dict,
           earliest: dict, last_started: dict, busy_until: list[int],
           level: list[int]) -> None:
  """Starts ``key`` at ``now`` and releases what it was holding back."""
  bid, j = key
  candidates.discard(key)
  actions.append(Action(now, bid, j))
  last_started[bid] = j
  for d in block.devices:
    busy_until[d] = now + block.span
    level[d] += block.memory
  for e in graph.successors(bid):
    succ = (e.dst, j)
    waiting[succ] -= 1
    earliest[succ] = max(earliest.get(succ, 0), now + block.span + e.delay)
    if waiting[succ] == 0 and last_started[e.dst] == j - 1:
      candidates.add(succ)
  if j + 1 < n:  # the next micro-batch of this block may now start
    nxt = (bid, j + 1)
    earliest[nxt] = max(earliest.get(nxt, 0), now + 1)
    if waiting[nxt] == 0:
      candidates.add(nxt)


def best_list_schedule(graph: BlockGraph, num_microbatches: int,
                       memory_limit: int | None) -> tuple[Action, ...] | None:
  """The shortest of the priority rules' schedules (None if all get stuck)."""
  best = None
  best_end = None
  for rule in PRIORITIES:
    actions = list_schedule(graph, num_microbatches, memory_limit, rule)
    if actions is None:
      continue
    end = max(a.start + graph.block(a.block).span for a in actions)
    if best_end is None or end < best_end:
      best, best_end = actions, end
  return best
