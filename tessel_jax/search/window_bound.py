"""A period lower bound from memory windows: activations that cannot overlap.

Under a tight limit a device may be unable to hold one activation for two
micro-batches at once. Take a block ``a`` that allocates on device ``d``
(memory > 0) and a later block ``r`` on ``d`` (a path leads from ``a`` to
``r``). While one micro-batch is between the starts of ``a`` and ``r`` it
holds at least ``W`` on ``d``: the least level of a set of its blocks that
can have started then (a set closed under predecessors that holds ``a`` and
not ``r``). The next micro-batch's ``a`` brings at least ``A``: the least
level of a started set that holds ``a`` and nothing after it. If ``W + A``
exceeds the limit and no micro-batch ever holds less than nothing on ``d``,
the next ``a`` cannot start before ``r`` has started, nor while ``r`` runs
on ``d``: the *window* from the start of ``a`` to the end of ``r`` lasts at
most one period. So:

* ``P >=`` the window's shortest length (the longest path from ``a`` to
  ``r``, spans and delays);
* the blocks of one micro-batch on a path from ``a`` to ``r`` run at
  disjoint steps inside one period, so their phases are disjoint modulo
  ``P``; every block that shares a device with each of them (and with each
  other one added), such as a block on all devices, must avoid them all
  too. The spans of such a set add up to at most ``P``.

Examples: nnshape, 4 devices, limit 4: device 0 holds F0 until B0 starts,
and the next micro-batch's F9 brings F0 F4 F5 F9 (4), so the window F9 ..
B0 (31 steps) and the all-device F4 beside it give 32, the optimum. mllm,
32 devices, limit 3: the window F1 .. B1 of device 0 (132 steps) and the
all-device F0 and B0 give 136.

Measured on the tight limits of ``experiments.search_cases`` (4 to 32
devices, training): the bound is the optimal period of every placement but
xshape (its two V's hold memory on the same devices in turn: 16, 32, 64,
128 against 26, 50, 98, 194); it was what CP-SAT could not prove at 16 and
32 devices (nnshape 104 and 200, nnshape_eager 122 and 234, mllm 136,
finetune 97; its proofs stopped 1 to 47 periods short in 60 s). It costs
0.01-0.1 s.

Pure Python (no solver): the levels are minimised over the sets of a
device's memory blocks closed under predecessors, enumerated up to
``_MAX_IDEALS`` per device (a device with more is skipped: the bound stays
valid, only weaker).
"""

from __future__ import annotations

from tessel_jax.graph import BlockGraph

# Most predecessor-closed sets of one device's memory blocks enumerated; a
# chain of k blocks has k + 1, parallel branches multiply.
_MAX_IDEALS = 4096


def window_period_bound(graph: BlockGraph, memory_limit: int | None) -> int:
  """The largest period bound over the memory windows of every device.

  Args:
    graph: The placement.
    memory_limit: Per-device limit (None: no limit, so no bound).

  Returns:
    A period no repetend under ``memory_limit`` is shorter than (1 when no
    window is forced).
  """
  if not memory_limit or memory_limit <= 0:
    return 1
  order = graph.topological_order()
  descendants = _descendants(graph, order)
  bound = 1
  for d in range(graph.num_devices):
    for a, r in _forced_windows(graph, d, memory_limit, descendants):
      bound = max(bound, _window_bound(graph, a, r, order, descendants))
  return bound


def _descendants(graph: BlockGraph, order: tuple[int, ...]
                 ) -> dict[int, set[int]]:
  """Every block's strict descendants (the blocks a path leads to)."""
  out: dict[int, set[int]] = {}
  for block_id in reversed(order):
    below: set[int] = set()
    for e in graph.successors(block_id):
      below.add(e.dst)
      below |= out[e.dst]
    out[block_id] = below
  return out


def _forced_windows(graph: BlockGraph, device: int, memory_limit: int,
                    descendants: dict[int, set[int]]
                    ) -> list[tuple[int, int]]:
  """The pairs ``(a, r)`` of block ids on ``device`` whose window lasts at
  most one period (module docstring)."""
  held = [b for b in graph.blocks_on(device) if b.memory != 0]
  ideals = _ideals([b.id for b in held], descendants)
  if ideals is None:
    return []
  memory = {b.id: b.memory for b in held}
  levels = [(ideal, sum(memory[i] for i in ideal)) for ideal in ideals]
  if min(level for _, level in levels) < 0:
    return []  # a micro-batch could offset another's level: no argument
  on_device = [b.id for b in graph.blocks_on(device)]
  out = []
  for a in (b.id for b in held if b.memory > 0):
    # Started sets as a starts: hold a, nothing after it.
    brought = min(level for ideal, level in levels
                  if a in ideal and not ideal & descendants[a])
    for r in on_device:
      if r not in descendants[a]:
        continue
      # Started sets between the starts of a and r: hold a, not r (nor,
      # closed under predecessors, anything after r).
      after_r = descendants[r] | {r}
      between = [level for ideal, level in levels
                 if a in ideal and not ideal & after_r]
      if between and min(between) + brought > memory_limit:
        out.append((a, r))
  return out


def _ideals(ids: list[int], descendants: dict[int, set[int]]
            ) -> list[frozenset[int]] | None:
  """The subsets of ``ids`` closed under predecessors (among ``ids``, by
  paths of the graph); None if there are more than ``_MAX_IDEALS``."""
  before = {i: {j for j in ids if i in descendants[j]} for i in ids}
  found = {frozenset()}
  frontier = [frozenset()]
  while frontier:
    grown = []
    for ideal in frontier:
      for i in ids:
        if i not in ideal and before[i] <= ideal:
          bigger = ideal | {i}
          if bigger not in found:
            found.add(bigger)
            grown.append(bigger)
            if len(found) > _MAX_IDEALS:
              return None
    frontier = grown
  return list(found)


def _window_bound(graph: BlockGraph, a: int, r: int,
                  order: tuple[int, ...],
                  descendants: dict[int, set[int]]) -> int:
  """``max(window length, spans of a pairwise-disjoint set)`` for the
  forced window from block ``a`` to block ``r``."""
  inside = [i for i in order
            if i == a or (i in descendants[a] and
                          (i == r or r in descendants[i]))]
  inside_set = set(inside)
  # Longest paths from a: by start times (spans and delays) and by the
  # spans of the blocks on the path (pairwise disjoint in time).
  start = {a: 0}
  spans = {a: graph.block(a).span}
  previous: dict[int, int] = {}
  for i in inside:
    for e in graph.successors(i):
      if e.dst not in inside_set:
        continue
      start[e.dst] = max(start.get(e.dst, 0),
                         start[i] + graph.block(i).span + e.delay)
      through = spans[i] + graph.block(e.dst).span
      if through > spans.get(e.dst, 0):
        spans[e.dst], previous[e.dst] = through, i
  length = start[r] + graph.block(r).span
  path = [r]
  while path[-1] != a:
    path.append(previous[path[-1]])
  # Blocks that share a device with every block of the path and with each
  # other (greedily, longest first): their phases avoid the path's too.
  disjoint = [set(graph.block(i).devices) for i in path]
  total = sum(graph.block(i).span for i in path)
  others = sorted((b for b in graph.blocks if b.id not in path),
                  key=lambda b: (-b.span, b.id))
  for b in others:
    if all(set(b.devices) & devices for devices in disjoint):
      disjoint.append(set(b.devices))
      total += b.span
  return max(length, total)
