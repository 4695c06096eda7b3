"""Classic pipeline schedules in the Schedule IR, for like-for-like comparison.

Every baseline is a function ``(graph, num_microbatches) -> UnrolledSchedule``
with ``status="BASELINE"``, ``source`` set to its registry name and
``period=None``. Each one fixes an order of actions per device; the times come
from :func:`tessel_jax.schedule.schedule_in_device_order` (ASAP, keeping every
device's order), so dependencies, edge delays, device exclusivity and
in-order micro-batches hold by construction.

Baselines (registry name: function, placements it fits):

* ``gpipe``: :func:`gpipe`, any placement. All forward blocks of all
  micro-batches, then all backward blocks, stage by stage.
* ``1f1b``: :func:`one_f_one_b`, any training placement: the classic
  PipeDream-flush / Megatron 1F1B on V-shape chains (one single-device stage
  per device), and on other placements (``mshape``, ``interleaved``,
  ``xshape``, ...) 1F1B over the stage list (forward blocks in topological
  order), as PyTorch runs it for any list of stages: a block shared by
  several devices is a stage on each of them.
* ``interleaved_1f1b``: :func:`interleaved_1f1b`, ``interleaved`` placements
  with >= 2 chunks. Megatron's interleaved 1F1B.
* ``chimera``: :func:`chimera`, ``xshape``. Two opposite pipelines merged per
  device (see the function for the variant).
* ``zb_h1``: :func:`zb_h1`, ``vshape`` with ``split_backward=True``. ZB-H1 of
  the zero-bubble paper (Qi et al., 2023): 1F1B with each ``W`` deferred by
  the stage index, at 1F1B's peak memory (the maximum over devices).

* ``dualpipev``: :func:`dualpipev`, ``zbv`` placements (V shape, two stages
  per device, split backward). DeepSeek's DualPipeV (the DualPipe
  repository's ``dualpipev.py``), its eight phases per rank; ``N >= 2D``.
* ``zbv``: :func:`zbv_baseline`, ``zbv`` placements. ZB-V of the zero-bubble
  paper (the greedy of its repository), memory capped at 1F1B's peak.

With a split backward, the baselines that do not place ``W`` themselves run
each ``W`` right after its ``B`` (fused backward).

No jax, no ortools here.
"""

from __future__ import annotations

import dataclasses
import numbers
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from tessel_jax import placements
from tessel_jax.graph import BlockGraph, PlacementError
from tessel_jax.schedule import (Action, ScheduleError, UnrolledSchedule,
                                 schedule_in_device_order)
from tessel_jax.search import v_orders

Key = tuple[int, int]  # (block id, micro-batch)


# --- structure of chain placements --------------------------------------------

@dataclasses.dataclass(frozen=True)
class _Chain:
  """A chain of single-device forward stages with their backward blocks.

  Attributes:
    forward: Forward block id per stage, in chain order.
    backward: ``B`` block id per stage.
    weight: ``W`` block id per stage (all None without split backward).
    devices: Device per stage.
  """

  forward: tuple[int, ...]
  backward: tuple[int, ...]
  weight: tuple[int | None, ...]
  devices: tuple[int, ...]

  @property
  def split(self) -> bool:
    return self.weight[0] is not None


def _chains(graph: BlockGraph) -> list[_Chain] | str:
  """Splits a training graph into forward chains, or says why it cannot.

  Every forward block must run on one device, have a ``B`` (and all or none a
  ``W``), and have at most one forward predecessor and successor.

  Returns:
    The chains ordered by their first forward id, or a reason string.
  """
  try:
    owner = placements.backward_of(graph)
  except PlacementError as err:
    return f"its block names break the F{{i}}/B{{i}}/W{{i}} convention ({err})"
  forwards = [b for b in graph.blocks if b.kind == "F"]
  b_of: dict[int, int] = {}
  w_of: dict[int, int] = {}
  for block_id, fwd in owner.items():
    (b_of if graph.block(block_id).kind == "B" else w_of)[fwd] = block_id
  for f in forwards:
    if len(f.devices) != 1:
      return f"forward block {f.label} runs on {len(f.devices)} devices"
    if f.id not in b_of:
      return (f"forward block {f.label} has no backward (an inference or"
              " frozen block)")
  if w_of and set(w_of) != set(b_of):
    return "only some backward blocks are split into B and W"
  is_forward = {f.id for f in forwards}
  succ: dict[int, list[int]] = {f.id: [] for f in forwards}
  pred: dict[int, list[int]] = {f.id: [] for f in forwards}
  for e in graph.edges:
    if e.src in is_forward and e.dst in is_forward:
      succ[e.src].append(e.dst)
      pred[e.dst].append(e.src)
  for f in forwards:
    if len(succ[f.id]) > 1 or len(pred[f.id]) > 1:
      return f"forward block {f.label} branches or joins"
  chains = []
  for f in forwards:
    if pred[f.id]:
      continue
    ids = [f.id]
    while succ[ids[-1]]:
      ids.append(succ[ids[-1]][0])
    chains.append(_Chain(
        forward=tuple(ids), backward=tuple(b_of[i] for i in ids),
        weight=tuple(w_of.get(i) for i in ids),
        devices=tuple(graph.block(i).devices[0] for i in ids)))
  return chains


def _vshape_chain(graph: BlockGraph) -> _Chain | str:
  chains = _chains(graph)
  if isinstance(chains, str):
    return chains
  if len(chains) != 1:
    return f"it has {len(chains)} forward chains, not one"
  chain = chains[0]
  if sorted(chain.devices) != list(range(graph.num_devices)):
    return ("its chain does not run exactly one stage on every device"
            f" (stage devices {list(chain.devices)})")
  return chain


def _interleaved_chain(graph: BlockGraph) -> tuple[_Chain, int] | str:
  chains = _chains(graph)
  if isinstance(chains, str):
    return chains
  if len(chains) != 1:
    return f"it has {len(chains)} forward chains, not one"
  chain, d = chains[0], graph.num_devices
  stages = len(chain.forward)
  if stages % d or stages < 2 * d:
    return (f"its chain has {stages} stages; interleaving needs a multiple of"
            f" {d} devices with at least 2 chunks per device")
  if sorted(chain.devices[:d]) != list(range(d)) or any(
      chain.devices[s] != chain.devices[s % d] for s in range(stages)):
    return ("its stages do not repeat the device order of the first chunk"
            " (stage s must run on the device of stage s % D)")
  return chain, stages // d


def _xshape_chains(graph: BlockGraph) -> tuple[_Chain, _Chain] | str:
  chains = _chains(graph)
  if isinstance(chains, str):
    return chains
  if len(chains) != 2:
    return f"it has {len(chains)} forward chains, not two"
  down, up = chains
  d = graph.num_devices
  if sorted(down.devices) != list(range(d)):
    return "its first chain does not run one stage on every device"
  if up.devices != down.devices[::-1]:
    return "its second chain does not run the first chain's devices reversed"
  return down, up


def _fits_gpipe(graph: BlockGraph) -> BlockGraph:
  return graph


@dataclasses.dataclass(frozen=True)
class _StageList:
  """Forward blocks of a training graph as one chain of stages.

  Attributes:
    forward: Forward block id per stage, in chain order.
    owner: Every ``B``/``W`` block id -> its forward block id.
  """

  forward: tuple[int, ...]
  owner: Mapping[int, int]


def _stage_list(graph: BlockGraph) -> _StageList | str:
  """The graph's forward blocks as a stage list (topological order).

  A chain is the usual stage list; branching placements (``kshape``,
  ``xshape``) list their forward blocks in topological order.
  """
  if graph.is_inference:
    return "it is an inference placement (no backward blocks to interleave)"
  try:
    owner = placements.backward_of(graph)
  except PlacementError as err:
    return f"its block names break the F{{i}}/B{{i}}/W{{i}} convention ({err})"
  order = tuple(b for b in graph.topological_order()
                if graph.block(b).kind == "F")
  return _StageList(forward=order, owner=owner)


def _fits_1f1b(graph: BlockGraph) -> _Chain | _StageList | str:
  found = _vshape_chain(graph)
  return found if not isinstance(found, str) else _stage_list(graph)


def _fits_zb_h1(graph: BlockGraph) -> _Chain | str:
  found = _vshape_chain(graph)
  if isinstance(found, str):
    return found
  if not found.split:
    return ("its backward is not split into B and W; build it with"
            " placements.vshape(D, split_backward=True)")
  return found


def _fits_v(graph: BlockGraph) -> _Chain | str:
  """A chain of ``2D`` single-device stages in a V (stage ``s`` on device
  ``s``, then ``2D-1-s``) with split backward, as ``placements.zbv``."""
  chains = _chains(graph)
  if isinstance(chains, str):
    return chains
  if len(chains) != 1:
    return f"it has {len(chains)} forward chains, not one"
  chain, d = chains[0], graph.num_devices
  want = tuple(s if s < d else 2 * d - 1 - s for s in range(2 * d))
  if chain.devices != want:
    return (f"its stages run on devices {list(chain.devices)}, not the V"
            f" {list(want)} (two stages per device)")
  if not chain.split:
    return ("its backward is not split into B and W; build it with"
            " placements.zbv(D) (split_backward=True)")
  return chain


# --- helpers ------------------------------------------------------------------

def _check_microbatches(num_microbatches: int) -> int:
  """Returns ``num_microbatches`` as an int; ValueError unless it is >= 1."""
  n = num_microbatches
  if isinstance(n, bool) or not isinstance(n, numbers.Integral) or n < 1:
    raise ValueError(
        f"num_microbatches must be an integer >= 1, got {num_microbatches!r}")
  return int(n)


def _require(name: str, graph: BlockGraph) -> Any:
  """Structure that baseline ``name`` needs; ValueError if it does not fit."""
  found = _FITS[name](graph)
  if isinstance(found, str):
    raise ValueError(
        f"baseline {name!r} supports {_SUPPORTS[name]}; placement"
        f" {graph.name!r} does not fit because {found}. Baselines that fit"
        f" it: {', '.join(for_placement(graph))}")
  return found


def _sequence_from_device_orders(
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


def _finish(graph: BlockGraph, num_microbatches: int,
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


def _one_f_one_b_order(forward: Sequence[Key],
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


def _stage_orders(chain: _Chain, stage: int, num_microbatches: int,
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


# --- baselines ----------------------------------------------------------------

def gpipe(graph: BlockGraph, num_microbatches: int) -> UnrolledSchedule:
  """GPipe: every forward of every micro-batch, then every backward.

  Fits any placement (for an inference placement it is the forward
  pipeline). Every device runs its forward blocks stage by stage (by
  topological position, then micro-batch: all micro-batches of its first
  stage, then of its next stage, ...), then its backward blocks (B and W) the
  same way. Memory peaks at ``N`` times each device's forward memory per
  micro-batch.
  """
  num_microbatches = _check_microbatches(num_microbatches)
  graph = _require("gpipe", graph)
  topo = {b: i for i, b in enumerate(graph.topological_order())}
  keys = sorted(
      ((b.id, m) for b in graph.blocks for m in range(num_microbatches)),
      key=lambda k: (graph.block(k[0]).kind != "F", topo[k[0]], k[1]))
  sequence = [Action(i, blk, mb) for i, (blk, mb) in enumerate(keys)]
  return _finish(graph, num_microbatches, sequence, "gpipe")


def one_f_one_b(graph: BlockGraph, num_microbatches: int) -> UnrolledSchedule:
  """1F1B (PipeDream-flush, Megatron's non-interleaved schedule).

  For a chain of ``D`` single-device stages (V-shape). Stage ``s`` runs
  ``min(D - s - 1, N)`` warm-up forwards, then alternates one forward and
  one backward, then drains the remaining backwards. Peak memory on stage
  ``s`` is ``min(N, D - s)`` forward activations. With a split backward each
  ``W`` runs right after its ``B``.
  """
  num_microbatches = _check_microbatches(num_microbatches)
  chain = _require("1f1b", graph)
  if isinstance(chain, _StageList):
    return _stage_list_1f1b(graph, chain, num_microbatches)
  d = len(chain.forward)
  orders = {}
  for s in range(d):
    fwd, bwd = _stage_orders(chain, s, num_microbatches)
    orders[chain.devices[s]] = _one_f_one_b_order(fwd, bwd, d - s - 1)
  sequence = _sequence_from_device_orders(graph, orders)
  return _finish(graph, num_microbatches, sequence, "1f1b")


def _stage_list_1f1b(graph: BlockGraph, stages: _StageList,
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
      orders[s] = _one_f_one_b_order(fwd, bwd, count - s - 1 + extra)
    try:
      timed = schedule_in_device_order(
          virtual, _sequence_from_device_orders(virtual, orders))
    except ScheduleError:
      if extra >= n:
        raise
      extra += 1
  keys = sorted(timed, key=lambda a: (a.start, topo[a.block], a.microbatch))
  sequence = [Action(i, a.block, a.microbatch) for i, a in enumerate(keys)]
  return _finish(graph, n, sequence, "1f1b")


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
  num_microbatches = _check_microbatches(num_microbatches)
  chain, v = _require("interleaved_1f1b", graph)
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
      orders[chain.devices[r]] = _one_f_one_b_order(fwd, bwd, warmup)
    sequence = _sequence_from_device_orders(graph, orders)
    try:
      return _finish(graph, num_microbatches, sequence, "interleaved_1f1b")
    except ScheduleError:
      if extra >= len(table):  # all warm-up: GPipe order, never deadlocks
        raise
      extra += 1


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
  num_microbatches = _check_microbatches(num_microbatches)
  found = _require("chimera", graph)
  d, n = graph.num_devices, num_microbatches
  queues: dict[int, list[list[Key]]] = {dev: [] for dev in range(d)}
  for chain in found:
    for s in range(d):
      fwd, bwd = _stage_orders(chain, s, n)
      queues[chain.devices[s]].append(_one_f_one_b_order(fwd, bwd, d - s - 1))
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
  return _finish(graph, n, sequence, "chimera")


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
  num_microbatches = _check_microbatches(num_microbatches)
  chain = _require("zb_h1", graph)
  d, n = len(chain.forward), num_microbatches
  orders = {}
  for s in range(d):
    fwd, bwd = _stage_orders(chain, s, n, with_weight=False)
    weight = chain.weight[s]
    groups = []
    for k, group in enumerate(bwd):
      group = list(group)
      if k - s >= 0:
        group.append((weight, k - s))
      groups.append(group)
    groups[-1].extend((weight, j) for j in range(max(0, n - s), n))
    orders[chain.devices[s]] = _one_f_one_b_order(fwd, groups, d - s - 1)
  sequence = _sequence_from_device_orders(graph, orders)
  return _finish(graph, n, sequence, "zb_h1")


def _v_schedule(graph: BlockGraph, chain: _Chain, n: int,
                orders: Sequence[Sequence[v_orders.Op]],
                source: str) -> UnrolledSchedule:
  """Maps ``(kind, half, m)`` device orders of a V chain to a schedule."""
  d = graph.num_devices
  ids = {"F": chain.forward, "B": chain.backward, "W": chain.weight}
  by_device = {}
  for r, order in enumerate(orders):
    stage = (r, 2 * d - 1 - r)
    by_device[r] = [(ids[kind][stage[half]], m) for kind, half, m in order]
  sequence = _sequence_from_device_orders(graph, by_device)
  return _finish(graph, n, sequence, source)


def dualpipev(graph: BlockGraph, num_microbatches: int) -> UnrolledSchedule:
  """DualPipeV (DeepSeek) on a ``zbv`` placement; see
  :func:`tessel_jax.search.v_orders.dualpipev_orders` for the order.

  Needs ``N >= 2D``. Memory: rank ``r`` runs ``2(R-r-1) + 2(r+1) = 2R``
  forwards before its first backward, so every device holds ``2D`` chunk
  activations at its peak (1F1B's ``D`` full-stage activations).
  """
  n = _check_microbatches(num_microbatches)
  chain = _require("dualpipev", graph)
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
  n = _check_microbatches(num_microbatches)
  chain = _require("zbv", graph)
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


# --- registry -----------------------------------------------------------------

BASELINES: dict[str, Callable[[BlockGraph, int], UnrolledSchedule]] = {
    "gpipe": gpipe,
    "1f1b": one_f_one_b,
    "interleaved_1f1b": interleaved_1f1b,
    "chimera": chimera,
    "zb_h1": zb_h1,
    "dualpipev": dualpipev,
    "zbv": zbv_baseline,
}

# name -> function returning the structure the baseline needs, or why not.
_FITS: dict[str, Callable[[BlockGraph], Any]] = {
    "gpipe": _fits_gpipe,
    "1f1b": _fits_1f1b,
    "interleaved_1f1b": _interleaved_chain,
    "chimera": _xshape_chains,
    "zb_h1": _fits_zb_h1,
    "dualpipev": _fits_v,
    "zbv": _fits_v,
}

_SUPPORTS: dict[str, str] = {
    "gpipe": "every placement",
    "1f1b": ("training placements (the forward blocks in topological order"
             " are the stage list; shared blocks allowed)"),
    "interleaved_1f1b": ("interleaved placements with >= 2 chunks (stage s on"
                         " device s % D, each with a backward)"),
    "chimera": ("xshape placements (two chains over devices 0..D-1 and"
                " D-1..0, each stage with a backward)"),
    "zb_h1": ("vshape placements with split_backward=True (every stage has B"
              " and W)"),
    "dualpipev": ("zbv placements (2D stages in a V, two per device, split"
                  " backward), N >= 2D"),
    "zbv": "zbv placements (2D stages in a V, two per device, split backward)",
}


# Other names accepted by :func:`run` (and ``tj.schedule(plan=...)``).
ALIASES: dict[str, str] = {
    "interleaved": "interleaved_1f1b",
    "zb": "zb_h1",
    "dualpipe_v": "dualpipev",
    "zb_v": "zbv",
}


def canonical_name(name: str) -> str:
  """The registry name of baseline ``name`` or of its alias (any case)."""
  if not isinstance(name, str):
    return name
  return ALIASES.get(name.lower(), name.lower())


def for_placement(graph: BlockGraph) -> list[str]:
  """Names of the baselines that fit ``graph``, in registry order."""
  return [name for name, fits in _FITS.items()
          if not isinstance(fits(graph), str)]


def run(name: str, graph: BlockGraph,
        num_microbatches: int) -> UnrolledSchedule:
  """Runs baseline ``name`` (a key of :data:`BASELINES`) on ``graph``.

  Raises:
    ValueError: for an unknown name or a placement the baseline does not fit.
  """
  try:
    fn = BASELINES[canonical_name(name)]
  except (KeyError, TypeError):
    aliases = ", ".join(f"{a} ({t})" for a, t in ALIASES.items())
    raise ValueError(
        f"unknown baseline {name!r}; valid names are"
        f" {', '.join(BASELINES)} (aliases: {aliases})") from None
  return fn(graph, num_microbatches)
