"""Chimera (``baselines``): two opposite 1F1B pipelines on an ``xshape``
placement, merged per device by a time-stepped list scheduler.

No jax, no ortools here.
"""

from __future__ import annotations

from collections.abc import Callable

from tessel_jax.graph import BlockGraph
from tessel_jax.schedule import Action, ScheduleError, UnrolledSchedule
from tessel_jax.search.baseline_fits import require
from tessel_jax.search.baseline_orders import (Key, check_microbatches,
                                               finish, one_f_one_b_order,
                                               stage_orders)


def chimera(graph: BlockGraph, num_microbatches: int) -> UnrolledSchedule:
  """Chimera (Li & Hoefler, SC'21), a simple faithful variant, for ``xshape``.

  One micro-batch of the X-shape placement carries two model micro-batches:
  one through the down pipeline (chain A, devices ``0..D-1``) and one
  through the up pipeline (chain B, devices ``D-1..0``), so ``N`` graph
  micro-batches are Chimera's ``2N`` micro-batches, half in each direction.
  Each pipeline keeps its own 1F1B order (stage ``s`` of a pipeline runs
  ``min(D - s - 1, N)`` warm-up forwards). Every device hosts one stage of
  each pipeline and merges their two orders greedily in time: whenever it is
  free it runs the head of an order that is ready, preferring backward work,
  then the head that became ready first, then the down pipeline. This fills
  one pipeline's bubbles with the other's work, as Chimera does; it leaves
  out Chimera's forward doubling / backward halving and its replication of
  weights (gradient all-reduce between the two directions). With a split
  backward each ``W`` runs right after its ``B``.
  """
  num_microbatches = check_microbatches(num_microbatches)
  found = require("chimera", graph)
  d, n = graph.num_devices, num_microbatches
  queues: dict[int, list[list[Key]]] = {dev: [] for dev in range(d)}
  for chain in found:
    for s in range(d):
      fwd, bwd = stage_orders(chain, s, n)
      queues[chain.devices[s]].append(one_f_one_b_order(fwd, bwd, d - s - 1))
  sim = _Simulator(graph, n)
  heads = {dev: [0] * len(qs) for dev, qs in queues.items()}

  def pick(dev: int, t: int) -> Key | None:
    best, best_rank = None, None
    for q, order in enumerate(queues[dev]):
      if heads[dev][q] >= len(order):
        continue
      key = order[heads[dev][q]]
      ready = sim.ready_time(key)
      if ready is None or ready > t:
        continue
      rank = (graph.block(key[0]).kind == "F", ready, q)
      if best_rank is None or rank < best_rank:
        best, best_rank = (q, key), rank
    if best is None:
      return None
    heads[dev][best[0]] += 1
    return best[1]

  sequence = sim.run(pick)
  return finish(graph, n, sequence, "chimera")


class _Simulator:
  """Time-stepped list scheduler for single-device blocks.

  At every integer step each free device asks ``pick(device, t)`` for an
  action that is ready at ``t`` (dependencies finished plus edge delays, the
  previous micro-batch of the same block started) and starts it.
  """

  def __init__(self, graph: BlockGraph, num_microbatches: int):
    self.graph = graph
    self.n = num_microbatches
    self.start: dict[Key, int] = {}
    self._preds = {b.id: graph.predecessors(b.id) for b in graph.blocks}
    self._span = {b.id: b.span for b in graph.blocks}

  def ready_time(self, key: Key) -> int | None:
    """Earliest start of ``key`` given what is placed; None if blocked."""
    blk, mb = key
    t = 0
    for e in self._preds[blk]:
      s = self.start.get((e.src, mb))
      if s is None:
        return None
      t = max(t, s + self._span[e.src] + e.delay)
    if mb > 0:
      s = self.start.get((blk, mb - 1))
      if s is None:
        return None
      t = max(t, s + 1)
    return t

  def run(self, pick: Callable[[int, int], Key | None]) -> list[Action]:
    graph = self.graph
    total = graph.num_blocks * self.n
    horizon = self.n * sum(b.span for b in graph.blocks) + self.n * sum(
        e.delay for e in graph.edges) + self.n + 1
    busy_until = {d: 0 for d in range(graph.num_devices)}
    t = 0
    while len(self.start) < total:
      if t > horizon:
        raise ScheduleError(
            "baseline simulation made no progress: the per-device orders"
            " deadlock against the placement's dependencies")
      for d in range(graph.num_devices):
        if busy_until[d] > t:
          continue
        key = pick(d, t)
        if key is None:
          continue
        block = graph.block(key[0])
        if block.devices != (d,):
          raise ScheduleError(
              f"baseline simulation handles single-device blocks only;"
              f" {block.label} runs on {list(block.devices)}")
        self.start[key] = t
        busy_until[d] = t + block.span
      t += 1
    return [Action(s, blk, mb)
            for (blk, mb), s in sorted(self.start.items(),
                                        key=lambda kv: (kv[1], kv[0]))]
