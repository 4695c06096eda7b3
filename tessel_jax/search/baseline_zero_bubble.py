"""The zero-bubble family (``baselines``): ZB-H1 on split-backward
V-shapes, and DualPipeV and ZB-V on ``zbv`` placements (their device
orders come from ``v_orders``).

No jax, no ortools here.
"""

from __future__ import annotations

from collections.abc import Sequence

from tessel_jax.graph import BlockGraph
from tessel_jax.schedule import UnrolledSchedule
from tessel_jax.search import v_orders
from tessel_jax.search.baseline_fits import Chain, require
from tessel_jax.search.baseline_orders import (check_microbatches, finish,
                                               one_f_one_b_order,
                                               sequence_from_device_orders,
                                               stage_orders)


def zb_h1(graph: BlockGraph, num_microbatches: int) -> UnrolledSchedule:
  """ZB-H1 (zero-bubble paper, Qi et al. 2023) for split-backward V-shapes.

  Forward and input-gradient blocks keep 1F1B's order: stage ``s`` of ``D``
  runs ``min(D - s - 1, N)`` warm-up forwards, then alternates F and B, then
  drains the Bs. The weight-gradient blocks are deferred by the stage index:
  ``W`` of micro-batch ``j`` runs right after ``B`` of micro-batch ``j + s``,
  and the last ``s`` Ws run after the last B, where they fill the tail
  bubbles. The B chain never waits for a W, so the first backward reaches
  stage 0 after ``D F + (D-1) B`` steps instead of ``D F + (D-1)(B + W)``.

  Memory (``F`` +2, ``B`` -1, ``W`` -1): stage ``s`` holds at most
  ``min(2 N, 2 min(N, D-s) + s)`` units, so the peak over all devices is
  1F1B's (``2 min(N, D)``, on stage 0), which is the paper's claim; later
  stages use their spare memory for the deferred Ws. With unit spans and
  ``N >= D`` the makespan is ``N (F + B + W) + (D - 1)(F + B - W)``, the
  paper's ZB-H1 bubble.
  """
  num_microbatches = check_microbatches(num_microbatches)
  chain = require("zb_h1", graph)
  d, n = len(chain.forward), num_microbatches
  orders = {}
  for s in range(d):
    fwd, bwd = stage_orders(chain, s, n, with_weight=False)
    weight = chain.weight[s]
    groups = []
    for k, group in enumerate(bwd):
      group = list(group)
      if k - s >= 0:
        group.append((weight, k - s))
      groups.append(group)
    groups[-1].extend((weight, j) for j in range(max(0, n - s), n))
    orders[chain.devices[s]] = one_f_one_b_order(fwd, groups, d - s - 1)
  sequence = sequence_from_device_orders(graph, orders)
  return finish(graph, n, sequence, "zb_h1")


def _v_schedule(graph: BlockGraph, chain: Chain, n: int,
                orders: Sequence[Sequence[v_orders.Op]],
                source: str) -> UnrolledSchedule:
  """Maps ``(kind, half, m)`` device orders of a V chain to a schedule."""
  d = graph.num_devices
  ids = {"F": chain.forward, "B": chain.backward, "W": chain.weight}
  by_device = {}
  for r, order in enumerate(orders):
    stage = (r, 2 * d - 1 - r)
    by_device[r] = [(ids[kind][stage[half]], m) for kind, half, m in order]
  sequence = sequence_from_device_orders(graph, by_device)
  return finish(graph, n, sequence, source)


def dualpipev(graph: BlockGraph, num_microbatches: int) -> UnrolledSchedule:
  """DualPipeV (DeepSeek) on a ``zbv`` placement; see
  :func:`tessel_jax.search.v_orders.dualpipev_orders` for the order.

  Needs ``N >= 2D``. Memory: rank ``r`` runs ``2(R-r-1) + 2(r+1) = 2R``
  forwards before its first backward, so every device holds ``2D`` chunk
  activations at its peak (1F1B's ``D`` full-stage activations).
  """
  n = check_microbatches(num_microbatches)
  chain = require("dualpipev", graph)
  try:
    orders = v_orders.dualpipev_orders(graph.num_devices, n)
  except ValueError as err:
    raise ValueError(f"baseline 'dualpipev' on {graph.name!r}: {err}") from None
  return _v_schedule(graph, chain, n, orders, "dualpipev")


def zbv_baseline(graph: BlockGraph,
                 num_microbatches: int) -> UnrolledSchedule:
  """ZB-V (zero-bubble paper) on a ``zbv`` placement; see
  :func:`tessel_jax.search.v_orders.zbv_orders`.

  The greedy runs on the spans and memory of stage 0's F, B and W, with
  the reference's memory cap: ``2D`` forwards' memory (1F1B's peak).
  """
  n = check_microbatches(num_microbatches)
  chain = require("zbv", graph)
  f, b, w = (graph.block(chain.forward[0]), graph.block(chain.backward[0]),
             graph.block(chain.weight[0]))
  delays = [e.delay for e in graph.edges]
  costs = v_orders.Costs(span=(f.span, b.span, w.span),
                         memory=(f.memory, b.memory, w.memory),
                         max_memory=2 * graph.num_devices * max(f.memory, 1),
                         comm=max(delays, default=0))
  try:
    orders = v_orders.zbv_orders(graph.num_devices, n, costs)
  except ValueError as err:
    raise ValueError(f"baseline 'zbv' on {graph.name!r}: {err}") from None
  return _v_schedule(graph, chain, n, orders, "zbv")
