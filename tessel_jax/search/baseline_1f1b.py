"""GPipe and the 1F1B family (``baselines``): GPipe, 1F1B on a chain or a
stage list, and Megatron's interleaved 1F1B.

No jax, no ortools here.
"""

from __future__ import annotations

import dataclasses

from tessel_jax.graph import BlockGraph
from tessel_jax.schedule import (Action, ScheduleError, UnrolledSchedule,
                                 schedule_in_device_order)
from tessel_jax.search.baseline_fits import StageList, require
from tessel_jax.search.baseline_orders import (check_microbatches, finish,
                                               one_f_one_b_order,
                                               sequence_from_device_orders,
                                               stage_orders)


def gpipe(graph: BlockGraph, num_microbatches: int) -> UnrolledSchedule:
  """GPipe: every forward of every micro-batch, then every backward.

  Fits any placement (for an inference placement it is the forward
  pipeline). Every device runs its forward blocks stage by stage (by
  topological position, then micro-batch: all micro-batches of its first
  stage, then of its next stage, ...), then its backward blocks (B and W) the
  same way. Memory peaks at ``N`` times each device's forward memory per
  micro-batch.
  """
  num_microbatches = check_microbatches(num_microbatches)
  graph = require("gpipe", graph)
  topo = {b: i for i, b in enumerate(graph.topological_order())}
  keys = sorted(
      ((b.id, m) for b in graph.blocks for m in range(num_microbatches)),
      key=lambda k: (graph.block(k[0]).kind != "F", topo[k[0]], k[1]))
  sequence = [Action(i, blk, mb) for i, (blk, mb) in enumerate(keys)]
  return finish(graph, num_microbatches, sequence, "gpipe")


def one_f_one_b(graph: BlockGraph, num_microbatches: int) -> UnrolledSchedule:
  """1F1B (PipeDream-flush, Megatron's non-interleaved schedule).

  For a chain of ``D`` single-device stages (V-shape). Stage ``s`` runs
  ``min(D - s - 1, N)`` warm-up forwards, then alternates one forward and
  one backward, then drains the remaining backwards. Peak memory on stage
  ``s`` is ``min(N, D - s)`` forward activations. With a split backward each
  ``W`` runs right after its ``B``.
  """
  num_microbatches = check_microbatches(num_microbatches)
  chain = require("1f1b", graph)
  if isinstance(chain, StageList):
    return _stage_list_1f1b(graph, chain, num_microbatches)
  d = len(chain.forward)
  orders = {}
  for s in range(d):
    fwd, bwd = stage_orders(chain, s, num_microbatches)
    orders[chain.devices[s]] = one_f_one_b_order(fwd, bwd, d - s - 1)
  sequence = sequence_from_device_orders(graph, orders)
  return finish(graph, num_microbatches, sequence, "1f1b")


def _stage_list_1f1b(graph: BlockGraph, stages: StageList,
                     num_microbatches: int) -> UnrolledSchedule:
  """1F1B over a stage list whose stages may share devices.

  Every stage (forward block with its ``B``/``W``, in topological order)
  gets a virtual device of its own and runs 1F1B there: stage ``s`` of
  ``S`` runs ``S - s - 1`` warm-up forwards (more, by the smallest common
  amount, should a branching placement's orders deadlock), then alternates one forward and one backward group (B,
  then W), then drains. The virtual schedule fixes one order of all actions
  (by virtual start time); every real device runs its actions in that order,
  as soon as dependencies and its other stages allow. A block shared by
  several devices is thus a stage on each of them.
  """
  n, count = num_microbatches, len(stages.forward)
  stage_of = {f: s for s, f in enumerate(stages.forward)}
  stage_of.update({b: stage_of[f] for b, f in stages.owner.items()})
  virtual = BlockGraph(
      name=f"{graph.name}.stages", num_devices=count,
      blocks=tuple(dataclasses.replace(b, devices=(stage_of[b.id],))
                   for b in graph.blocks), edges=graph.edges)
  topo = {b: i for i, b in enumerate(graph.topological_order())}
  timed = None
  extra = 0
  while timed is None:  # more warm-up until the orders run (GPipe at worst)
    orders = {}
    for s, f in enumerate(stages.forward):
      mine = sorted((b for b, owner in stages.owner.items() if owner == f),
                    key=lambda b: (graph.block(b).kind, topo[b]))
      fwd = [(f, m) for m in range(n)]
      bwd = [[(b, m) for b in mine] for m in range(n)]
      orders[s] = one_f_one_b_order(fwd, bwd, count - s - 1 + extra)
    try:
      timed = schedule_in_device_order(
          virtual, sequence_from_device_orders(virtual, orders))
    except ScheduleError:
      if extra >= n:
        raise
      extra += 1
  keys = sorted(timed, key=lambda a: (a.start, topo[a.block], a.microbatch))
  sequence = [Action(i, a.block, a.microbatch) for i, a in enumerate(keys)]
  return finish(graph, n, sequence, "1f1b")


def interleaved_1f1b(graph: BlockGraph,
                     num_microbatches: int) -> UnrolledSchedule:
  """Megatron's interleaved 1F1B for ``interleaved`` placements.

  ``p`` devices, ``v >= 2`` chunks; stage ``c*p + r`` is chunk ``c`` on
  device ``r``. Forward work on every device runs in groups of ``p``
  micro-batches: chunk 0 of micro-batches ``0..p-1``, chunk 1 of the same
  micro-batches, ..., then the next group (a last group may be smaller when
  ``N`` is not a multiple of ``p``). Backward work follows the same table
  with the chunks reversed. Device ``r`` runs ``(p - r - 1) * 2 + (v - 1) * p``
  warm-up forwards (at most all of them), then alternates one forward and
  one backward, then drains the backwards. With a split backward each ``W``
  runs right after its ``B``.

  When ``N`` is not a multiple of ``p`` these orders can deadlock (the
  smaller last group; classic Megatron requires ``N % p == 0``). Then every
  device's warm-up grows by the smallest common amount that removes the
  deadlock; with all forwards as warm-up the order is GPipe's, which never
  deadlocks.
  """
  num_microbatches = check_microbatches(num_microbatches)
  chain, v = require("interleaved_1f1b", graph)
  p, n = graph.num_devices, num_microbatches
  table: list[tuple[int, int]] = []  # (micro-batch, chunk) in forward order
  for first in range(0, n, p):
    group = range(first, min(first + p, n))
    for c in range(v):
      table.extend((m, c) for m in group)
  extra = 0
  while True:
    orders = {}
    for r in range(p):
      stage_of = [c * p + r for c in range(v)]
      fwd = [(chain.forward[stage_of[c]], m) for m, c in table]
      bwd = []
      for m, c in table:
        stage = stage_of[v - 1 - c]
        group = [(chain.backward[stage], m)]
        if chain.weight[stage] is not None:
          group.append((chain.weight[stage], m))
        bwd.append(group)
      warmup = (p - r - 1) * 2 + (v - 1) * p + extra
      orders[chain.devices[r]] = one_f_one_b_order(fwd, bwd, warmup)
    sequence = sequence_from_device_orders(graph, orders)
    try:
      return finish(graph, num_microbatches, sequence, "interleaved_1f1b")
    except ScheduleError:
      if extra >= len(table):  # all warm-up: GPipe order, never deadlocks
        raise
      extra += 1
