"""Shared pieces of the classic schedules (``baselines``): 1F1B device
orders, merging per-device orders into one action sequence, and the
ASAP-timed ``UnrolledSchedule`` every baseline returns.

No jax, no ortools here.
"""

from __future__ import annotations

import numbers
from collections.abc import Mapping, Sequence

from tessel_jax.graph import BlockGraph
from tessel_jax.schedule import (Action, ScheduleError, UnrolledSchedule,
                                 schedule_in_device_order)
from tessel_jax.search.baseline_fits import Chain

Key = tuple[int, int]  # (block id, micro-batch)


def check_microbatches(num_microbatches: int) -> int:
  """Returns ``num_microbatches`` as an int; ValueError unless it is >= 1."""
  n = num_microbatches
  if isinstance(n, bool) or not isinstance(n, numbers.Integral) or n < 1:
    raise ValueError(
        f"num_microbatches must be an integer >= 1, got {num_microbatches!r}")
  return int(n)


def sequence_from_device_orders(
    graph: BlockGraph, orders: Mapping[int, Sequence[Key]]) -> list[Action]:
  """Merges per-device orders into one sequence that keeps each of them.

  A multi-device action must be at the head of every one of its devices'
  orders at once; the merge fails if the orders disagree.
  """
  heads = {d: 0 for d in orders}
  appearances: dict[Key, int] = {}
  for order in orders.values():
    for key in order:
      appearances[key] = appearances.get(key, 0) + 1
  out: list[Action] = []
  total = len(appearances)
  while len(out) < total:
    progressed = False
    for d in sorted(orders):
      if heads[d] >= len(orders[d]):
        continue
      key = orders[d][heads[d]]
      devices = graph.block(key[0]).devices
      if all(heads[x] < len(orders[x]) and orders[x][heads[x]] == key
             for x in devices):
        for x in devices:
          heads[x] += 1
        out.append(Action(len(out), key[0], key[1]))
        progressed = True
    if not progressed:
      raise ScheduleError(
          "per-device orders disagree on the order of multi-device blocks")
  return out


def finish(graph: BlockGraph, num_microbatches: int,
            sequence: Sequence[Action], source: str) -> UnrolledSchedule:
  actions = schedule_in_device_order(graph, sequence)
  expected = {(b.id, m) for b in graph.blocks for m in range(num_microbatches)}
  got = {(a.block, a.microbatch) for a in actions}
  if got != expected or len(actions) != len(expected):
    raise ScheduleError(
        f"baseline {source!r} placed {len(actions)} actions for"
        f" {len(expected)} (block, micro-batch) pairs")
  return UnrolledSchedule(
      graph=graph, num_microbatches=num_microbatches, actions=actions,
      memory_limit=None, period=None, repetend_microbatches=None,
      status="BASELINE", search_seconds=0.0, source=source)


def one_f_one_b_order(forward: Sequence[Key],
                       backward: Sequence[Sequence[Key]],
                       warmup: int) -> list[Key]:
  """``warmup`` forwards, then alternate forward / backward, then backwards.

  ``backward[i]`` is the group of actions run for the i-th backward (B, or B
  then W).
  """
  total = len(forward)
  warmup = min(warmup, total)
  order: list[Key] = list(forward[:warmup])
  for i in range(total - warmup):
    order.append(forward[warmup + i])
    order.extend(backward[i])
  for i in range(total - warmup, total):
    order.extend(backward[i])
  return order


def stage_orders(chain: Chain, stage: int, num_microbatches: int,
                  with_weight: bool = True
                  ) -> tuple[list[Key], list[list[Key]]]:
  """Forward keys and backward groups of one stage, by micro-batch."""
  n = num_microbatches
  fwd = [(chain.forward[stage], m) for m in range(n)]
  groups = []
  for m in range(n):
    group = [(chain.backward[stage], m)]
    if with_weight and chain.weight[stage] is not None:
      group.append((chain.weight[stage], m))
    groups.append(group)
  return fwd, groups
