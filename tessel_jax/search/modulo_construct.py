"""A repetend built without a solver: modulo scheduling aimed at a memory
limit (after Rau 1994's iterative modulo scheduling, with a packing
look-ahead instead of eviction, and local search on the memory and ramps).

``construct_repetend`` places the blocks one by one in a modulo reservation
table of ``period`` steps per device, the blocks on several devices first
(their phases cut every device's period into the runs the others fill, and
their occupancy decides the memory peak: drawn at random, or back to back
in a random order), then the others in topological order, each at the first
phase after its placed ancestors (longest path; before its placed
descendants when only those are placed: short lifetimes, so little memory in
flight) that leaves every device's remaining blocks packable into its free
runs (at the busiest device's load every step is taken, and a greedy table
without that check jams; Rau's eviction cycled on every try). The offsets
are the earliest the edges allow (``earliest_offsets``). A descent over
moves that keep every device's occupancy (swaps of interchangeable blocks,
one device's own blocks packed again in another order) lowers the steady
peak below the limit, then the latency. Of the first few distinct repetends
under the limit, the one whose modulo schedule compacted in device order
has the shortest ramps is kept and its ramps shortened by the same moves.
Restarts are seeded and counted, so the result is reproducible.

Pure Python, no solver: a repetend it returns at the smallest period the
bounds allow is optimal by that bound (``period_search.first_probe``).
"""

from __future__ import annotations

import dataclasses
import itertools
import random

from tessel_jax.graph import BlockGraph
from tessel_jax.schedule import (Repetend, Schedule, compact_in_order,
                                 modulo_actions)
from tessel_jax.search.modulo_solution import (ModuloSolution,
                                               earliest_offsets, normalise,
                                               steady_peak)
from tessel_jax.simulate import lower_bound_makespan_shared

# Restarts of the constructive scheduler per call.
_TRIES = 64
# Distinct repetends under the limit the restarts look for before the one
# whose ramps are shortest (``_ramps_overhead``) is returned: ``_KEEP``, or
# more on small placements (``_KEEP_BLOCKS`` / blocks), where restarts are
# cheap (nnshape, 4 devices, limit 13: 2072 at N = 128 from the best of 4,
# 2069 from the best of 8).
_KEEP = 4
_KEEP_BLOCKS = 160


def construct_repetend(graph: BlockGraph, period: int,
                       memory_limit: int | None, *, allow_wrap: bool = True,
                       seed: int = 0, tries: int = _TRIES,
                       keep: int | None = None) -> ModuloSolution | None:
  """A repetend of ``graph`` at ``period`` under ``memory_limit``, or None.

  Args:
    graph: The placement.
    period: The period (at least the busiest device's load).
    memory_limit: Per-device limit of the steady peak (None: none).
    allow_wrap: Let blocks wrap around the period end.
    seed: Seed of the restarts' random choices.
    tries: Restarts (each a construction and a descent).
    keep: Distinct repetends under the limit after which the one of
      shortest ramps (``_ramps_overhead``) is returned (None: ``_KEEP``
      or ``_KEEP_BLOCKS`` over the number of blocks, the larger).

  Returns:
    A ``FEASIBLE`` ``ModuloSolution`` (every edge, the one-block-at-a-time
    rule and the limit hold) or None if no restart found one.
  """
  if any(b.span > period for b in graph.blocks) or any(
      graph.device_load(d) > period for d in range(graph.num_devices)):
    return None
  shape = _shape(graph)
  kept, done = _restarts(graph, shape, period, memory_limit, allow_wrap,
                         random.Random(seed), tries,
                         keep or max(_KEEP, _KEEP_BLOCKS // graph.num_blocks))
  if not kept:
    return None
  if done is None:
    phases = min(kept, key=lambda ph: (kept[ph], _excess(
        shape, period, ph, memory_limit)))
    done = _ramps_descent(graph, shape, period, phases, kept[phases],
                          memory_limit, allow_wrap)
  offsets = normalise(earliest_offsets(graph, period, done))
  if memory_limit is not None:  # what ``_excess`` measured
    assert steady_peak(graph, period, done, offsets) <= memory_limit
  return ModuloSolution("FEASIBLE", offsets=offsets, phases=done)


def _restarts(graph: BlockGraph, shape: _Shape, period: int,
              memory_limit: int | None, allow_wrap: bool, rng: random.Random,
              tries: int, keep: int
              ) -> tuple[dict[tuple[int, ...], int], tuple[int, ...] | None]:
  """The distinct repetends under the limit that up to ``tries`` restarts
  (a construction and ``_swap_descent`` each) find, ``phases -> ramps'
  overhead``, stopping at ``keep`` of them; and the one whose compacted
  modulo schedule already meets the lower bound where one does (it ends
  the restarts: no repetend at the period unrolls shorter, so neither more
  restarts nor ``_ramps_descent`` can gain), else None."""
  dist = _longest_paths(graph)
  kept: dict[tuple[int, ...], int] = {}
  for attempt in range(tries):
    phases = _place(graph, period, dist, allow_wrap, rng, greedy=attempt == 0)
    if phases is None:
      continue
    phases = _swap_descent(graph, shape, period, phases, memory_limit,
                           allow_wrap)
    if phases not in kept and _excess(shape, period, phases,
                                      memory_limit)[0] == 0:
      kept[phases] = _ramps_overhead(graph, period, phases)
      if _at_bound(graph, period, phases, kept[phases]):
        return kept, phases
      if len(kept) >= keep:
        break
  return kept, None


def _ramps_overhead(graph: BlockGraph, period: int,
                    phases: tuple[int, ...]) -> int:
  """Steps the repetend's unrolling takes beyond ``N`` periods once its
  modulo schedule is compacted in each device's order (pure Python; the
  ramps' CP-SAT compaction starts from it and rarely gains more than a
  few steps: nnshape, 8 devices, limit 30: 2107-2115 before, the same
  after)."""
  offsets = normalise(earliest_offsets(graph, period, phases))
  rep = Repetend(period, offsets, phases)
  n = 2 * (rep.max_offset + 1) + 2
  actions = compact_in_order(graph, modulo_actions(Schedule(graph, rep), n))
  span = {b.id: b.span for b in graph.blocks}
  return max(a.start + span[a.block] for a in actions) - n * period


def _at_bound(graph: BlockGraph, period: int, phases: tuple[int, ...],
              overhead: int) -> bool:
  """Whether the unrolling ``_ramps_overhead`` measured (``overhead``
  steps beyond its ``N`` periods) meets
  ``simulate.lower_bound_makespan_shared``: no schedule is shorter."""
  offsets = normalise(earliest_offsets(graph, period, phases))
  n = 2 * (max(offsets) + 1) + 2
  return n * period + overhead <= lower_bound_makespan_shared(graph, n)


def _longest_paths(graph: BlockGraph) -> list[dict[int, int]]:
  """``dist[a][b]``: the least distance from the start of block ``a`` to the
  start of its descendant ``b`` (longest path of spans and delays), by
  graph index."""
  order = [graph.index(b) for b in graph.topological_order()]
  succ = [[] for _ in graph.blocks]
  for e in graph.edges:
    i = graph.index(e.src)
    succ[i].append((graph.index(e.dst), graph.blocks[i].span + e.delay))
  dist: list[dict[int, int]] = [{} for _ in graph.blocks]
  for a in order:
    row = dist[a]
    row[a] = 0
    for u in order:  # topological: every u's distance is final when read
      if u not in row:
        continue
      for v, w in succ[u]:
        if row.get(v, -1) < row[u] + w:
          row[v] = row[u] + w
  return dist


def _priority(graph: BlockGraph, rng: random.Random, greedy: bool
              ) -> list[int]:
  """Block indices in placement order: the blocks on several devices first
  (most devices first; in topological order when ``greedy``, else
  shuffled), then the others in topological order."""
  topo = [graph.index(b) for b in graph.topological_order()]
  shared = [i for i in topo if len(graph.blocks[i].devices) > 1]
  if not greedy:
    rng.shuffle(shared)
  shared.sort(key=lambda i: -len(graph.blocks[i].devices))
  return shared + [i for i in topo if len(graph.blocks[i].devices) == 1]


class _Table:
  """The modulo reservation table: which steps of each device's period are
  held, and which blocks are still to place on each device."""

  def __init__(self, graph: BlockGraph, period: int, allow_wrap: bool):
    self.graph, self.period, self.allow_wrap = graph, period, allow_wrap
    self.held = [[False] * period for _ in range(graph.num_devices)]
    self.todo = [sorted((b.span for b in graph.blocks_on(d)), reverse=True)
                 for d in range(graph.num_devices)]

  def steps(self, i: int, t: int) -> list[int]:
    return [(t + j) % self.period for j in range(self.graph.blocks[i].span)]

  def free(self, i: int, t: int) -> bool:
    """Whether block ``i`` may start at phase ``t``."""
    span = self.graph.blocks[i].span
    if not self.allow_wrap and t + span > self.period:
      return False
    return not any(self.held[d][s] for d in self.graph.blocks[i].devices
                   for s in self.steps(i, t))

  def put(self, i: int, t: int) -> None:
    span = self.graph.blocks[i].span
    for d in self.graph.blocks[i].devices:
      for s in self.steps(i, t):
        self.held[d][s] = True
      self.todo[d].remove(span)

  def take(self, i: int, t: int) -> None:
    span = self.graph.blocks[i].span
    for d in self.graph.blocks[i].devices:
      for s in self.steps(i, t):
        self.held[d][s] = False
      self.todo[d].append(span)
      self.todo[d].sort(reverse=True)

  def packable(self, devices: tuple[int, ...]) -> bool:
    """Whether the blocks left on each of ``devices`` still fit in its free
    runs of steps (a necessary condition for finishing the table)."""
    return all(_fits(self._runs(d), self.todo[d]) for d in devices)

  def _runs(self, d: int) -> list[int]:
    """Lengths of the free runs of device ``d``'s period (cyclic when
    blocks may wrap)."""
    held, period = self.held[d], self.period
    if not any(held):
      return [period]
    first = held.index(True) if self.allow_wrap else 0
    runs, run = [], 0
    for n in range(period):
      if held[(first + n) % period]:
        if run:
          runs.append(run)
        run = 0
      else:
        run += 1
    if run:
      runs.append(run)
    return runs


def _fits(runs: list[int], items: list[int]) -> bool:
  """Whether ``items`` (spans, largest first) pack into ``runs``."""
  if sum(items) > sum(runs):
    return False
  if not items:
    return True
  head, rest = items[0], items[1:]
  seen = set()
  for n, r in enumerate(runs):
    if r >= head and r not in seen:
      seen.add(r)
      runs[n] -= head
      ok = _fits(runs, rest)
      runs[n] += head
      if ok:
        return True
  return False


def _place(graph: BlockGraph, period: int, dist: list[dict[int, int]],
           allow_wrap: bool, rng: random.Random, greedy: bool
           ) -> tuple[int, ...] | None:
  """One construction: the phases of every block, or None where a block
  found no free phase that leaves the rest packable."""
  table = _Table(graph, period, allow_wrap)
  start: dict[int, int] = {}
  packed, end = rng.random() < 0.5, 0
  for i in _priority(graph, rng, greedy):
    early = max((start[a] + dist[a][i] for a in start if i in dist[a]),
                default=None)
    late = min((start[c] - dist[i][c] for c in start if c in dist[i]),
               default=None)
    if len(graph.blocks[i].devices) > 1 and not greedy:
      # The shared blocks' phases cut every device's period (offsets absorb
      # the edges): drawn at random, or (every other restart) back to back
      # in a random order, which leaves the others one long run to fill.
      base = rng.randrange(period) if not (packed and start) else end
      candidates = range(base, base + period)
    elif early is not None:
      candidates = range(early, early + period)
    elif late is not None:
      candidates = range(late, late - period, -1)
    else:
      base = 0 if greedy else rng.randrange(period)
      candidates = range(base, base + period)
    t = _first_packable(table, i, candidates, rng, greedy)
    if t is None:
      return None
    start[i] = t
    end = t + graph.blocks[i].span
  return tuple(start[i] % period for i in range(graph.num_blocks))


# Chance that a restart passes over a packable phase for the next one
# (diversity beyond the first, greedy, construction).
_SKIP = 0.15


def _first_packable(table: _Table, i: int, candidates, rng: random.Random,
                    greedy: bool) -> int | None:
  """The first start in ``candidates`` whose phase is free for block ``i``
  and leaves its devices packable (placed in ``table``)."""
  devices = table.graph.blocks[i].devices
  fallback = None
  for t in candidates:
    phase = t % table.period
    if not table.free(i, phase):
      continue
    table.put(i, phase)
    if table.packable(devices):
      if greedy or rng.random() >= _SKIP:
        return t
      fallback = t if fallback is None else fallback
    table.take(i, phase)
  if fallback is not None:
    table.put(i, fallback % table.period)
  return fallback


@dataclasses.dataclass(frozen=True)
class _Shape:
  """What ``_excess`` reads of a placement, by graph index, computed once
  per ``construct_repetend`` (the descents evaluate thousands of
  repetends: ``earliest_offsets`` and a per-device scan of the blocks
  each time took three quarters of the builder's CPU).

  Attributes:
    order: Block indices in topological order.
    inputs: Per block, ``(source index, source span + edge delay)`` of each
      edge entering it.
    spans: Per block, its span.
    held: Per device, ``(index, memory)`` of its blocks with memory.
  """

  order: tuple[int, ...]
  inputs: tuple[tuple[tuple[int, int], ...], ...]
  spans: tuple[int, ...]
  held: tuple[tuple[tuple[int, int], ...], ...]


def _shape(graph: BlockGraph) -> _Shape:
  """The ``_Shape`` of ``graph``."""
  inputs = tuple(
      tuple((graph.index(e.src), graph.block(e.src).span + e.delay)
            for e in graph.predecessors(b.id)) for b in graph.blocks)
  held = tuple(tuple((i, b.memory) for i, b in enumerate(graph.blocks)
                     if d in b.devices and b.memory)
               for d in range(graph.num_devices))
  return _Shape(order=tuple(graph.index(b) for b in graph.topological_order()),
                inputs=inputs, spans=tuple(b.span for b in graph.blocks),
                held=held)


def _earliest(shape: _Shape, period: int,
              phases: tuple[int, ...]) -> list[int]:
  """``modulo_solution.earliest_offsets`` on a ``_Shape`` (the same
  offsets)."""
  offsets = [0] * len(phases)
  inputs = shape.inputs
  for i in shape.order:
    k, r = 0, phases[i]
    for j, w in inputs[i]:
      need = -((r - offsets[j] * period - phases[j] - w) // period)
      if need > k:
        k = need
    offsets[i] = k
  return offsets


def _excess(shape: _Shape, period: int, phases: tuple[int, ...],
            memory_limit: int | None) -> tuple[int, int, int]:
  """How far the repetend with ``phases`` (earliest offsets) is over the
  limit: the sum of the devices' excesses, then the latency, then the sum
  of their peaks."""
  offsets = _earliest(shape, period, phases)
  over = total = 0
  for on_d in shape.held:
    level = _device_peak(on_d, phases, offsets)
    total += level
    over += max(0, level - (memory_limit or 0))
  starts = [k * period + r for k, r in zip(offsets, phases)]
  latency = (max(s + span for s, span in zip(starts, shape.spans))
             - min(starts))
  return over, latency, total


def _device_peak(on_d: tuple[tuple[int, int], ...], phases,
                 offsets) -> int:
  """A device's steady peak (``steady_peak`` for one device) from its
  blocks with memory (``_Shape.held``)."""
  level, by_phase = 0, {}
  for i, m in on_d:
    level -= m * offsets[i]
    r = phases[i]
    by_phase[r] = by_phase.get(r, 0) + m
  peak = 0
  for r in sorted(by_phase):
    level += by_phase[r]
    if level > peak:
      peak = level
  return peak


# Most orders of one device's own blocks a repack tries.
_REPACKS = 120


def _repacks(graph: BlockGraph, period: int, phases: tuple[int, ...],
             d: int, allow_wrap: bool):
  """Phases with device ``d``'s single-device blocks packed again, in
  every order (up to ``_REPACKS``), first fit into the steps the other
  blocks leave free on ``d`` (the rest of the table is unchanged, so every
  one is as valid as ``phases``)."""
  own = [i for i, b in enumerate(graph.blocks) if b.devices == (d,)]
  if len(own) < 2:
    return
  held = [False] * period
  for i, b in enumerate(graph.blocks):
    if d in b.devices and i not in own:
      for j in range(b.span):
        held[(phases[i] + j) % period] = True
  origin = held.index(True) if allow_wrap and any(held) else 0
  for order in itertools.islice(itertools.permutations(own), _REPACKS):
    trial, t = list(phases), origin
    for i in order:
      t = _next_fit(held, t, origin, graph.blocks[i].span, period,
                    allow_wrap)
      if t is None:
        break
      trial[i] = t % period
      t += graph.blocks[i].span
    else:
      yield tuple(trial)


def _next_fit(held: list[bool], t: int, origin: int, span: int,
              period: int, allow_wrap: bool) -> int | None:
  """The first start from ``t`` (before ``origin + period``) whose ``span``
  steps are free in ``held``."""
  while t + span <= origin + period:
    if not allow_wrap and t % period + span > period:
      t += 1
      continue
    if not any(held[(t + j) % period] for j in range(span)):
      return t
    t += 1
  return None


def _neighbours(graph: BlockGraph, period: int, phases: tuple[int, ...],
                allow_wrap: bool):
  """Phases one move away, each as valid as ``phases`` (the occupancy of
  every device is unchanged): two blocks on the same devices with the same
  span swapped, or one device's own blocks packed again (``_repacks``)."""
  groups: dict[tuple, list[int]] = {}
  for i, b in enumerate(graph.blocks):
    groups.setdefault((b.devices, b.span), []).append(i)
  for g in groups.values():
    for n, a in enumerate(g):
      for b in g[n + 1:]:
        trial = list(phases)
        trial[a], trial[b] = trial[b], trial[a]
        yield tuple(trial)
  for d in range(graph.num_devices):
    yield from _repacks(graph, period, phases, d, allow_wrap)


def _swap_descent(graph: BlockGraph, shape: _Shape, period: int,
                  phases: tuple[int, ...],
                  memory_limit: int | None, allow_wrap: bool = True
                  ) -> tuple[int, ...]:
  """``phases`` improved by ``_neighbours`` while the excess over the limit
  (then the latency, then the peaks' sum: ``_excess``) falls."""
  best = _excess(shape, period, phases, memory_limit)
  improved = True
  while improved:
    improved = False
    for trial in _neighbours(graph, period, phases, allow_wrap):
      score = _excess(shape, period, trial, memory_limit)
      if score < best:
        phases, best, improved = trial, score, True
  return phases


# Most repetends the ramps' descent evaluates (``_ramps_overhead`` each).
_RAMP_EVALS = 64


def _ramps_descent(graph: BlockGraph, shape: _Shape, period: int,
                   phases: tuple[int, ...], overhead: int,
                   memory_limit: int | None, allow_wrap: bool
                   ) -> tuple[int, ...]:
  """``phases`` (under the limit, ramps ``overhead``) improved by
  ``_neighbours`` that stay under the limit while the ramps shorten, for at
  most ``_RAMP_EVALS`` evaluations (nnshape, 8 devices, limit 30: 59 -> 50
  steps beyond N periods in 75)."""
  evals, improved = 0, True
  while improved and evals < _RAMP_EVALS:
    improved = False
    for trial in _neighbours(graph, period, phases, allow_wrap):
      if _excess(shape, period, trial, memory_limit)[0]:
        continue
      evals += 1
      trial_overhead = _ramps_overhead(graph, period, trial)
      if trial_overhead < overhead:
        phases, overhead, improved = trial, trial_overhead, True
        if _at_bound(graph, period, phases, overhead):
          return phases  # nothing is shorter
        break
      if evals >= _RAMP_EVALS:
        break
  return phases
