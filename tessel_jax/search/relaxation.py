"""Period lower bounds from relaxations: the placement seen from few devices.

Proving a period infeasible under a tight memory limit is what costs in the
period search: the full modulo model of a 32-device placement has hundreds
of blocks and a boolean per pair of blocks of a device. The limit usually
binds through the devices at the ends of the pipeline, whose activations are
held longest. So the model restricted to those devices decides the proof
with a handful of blocks:

* keep the blocks that occupy a chosen device (an all-device block keeps
  only those devices);
* replace every path between kept blocks by one edge with the longest
  path's length (spans and delays of the dropped blocks in between), so
  every start-time difference the full placement forces is still forced;
* keep the memory levels and the one-block-at-a-time rule of the chosen
  devices exactly as they are.

Every repetend of the full placement restricted to the kept blocks is a
repetend of this subgraph, so a period the subgraph cannot reach is
unreachable for the full placement: a valid proof of infeasibility. The
subgraph is solved with the full placement's start-time horizon, so it
admits every restricted repetend the full model admits.

Measured on the tight limits (``experiments.search_cases``): the ends of
the chain, devices ``0`` and ``D - 1``, give the proven optimal period for
vshape, interleaved, xshape, mshape, kshape, alphafold and zbv at 4 and 8
devices, and prove interleaved (224), xshape (194) and alphafold (128) at
32 devices in 0.1-3 s, where the full model did not in 60 s.

Placements whose all-device blocks collide with the middle of the chain
(nnshape, finetune, mllm) get a bound one short from the subgraph: the
proof needs the middle devices' blocks. The *pooled* relaxation keeps
every block but relaxes only the middle devices (no memory limit; one
shared pool of slots instead of one block at a time each), which keeps the
collision and drops most of the memory booleans (``Relaxation``).
"""

from __future__ import annotations

import dataclasses

from tessel_jax.graph import BlockGraph, Edge
from tessel_jax.search.modulo_constraints import latency_horizon
from tessel_jax.search.modulo_model import solve_modulo
from tessel_jax.search.modulo_solution import ModuloSolution


def end_devices(graph: BlockGraph) -> tuple[int, ...]:
  """The devices the relaxation keeps: the two ends of the pipeline."""
  return tuple(sorted({0, graph.num_devices - 1}))


def device_subgraph(graph: BlockGraph, devices: tuple[int, ...]
                    ) -> BlockGraph:
  """The placement restricted to the blocks that occupy ``devices``.

  Device ``devices[i]`` becomes device ``i``. Each pair of kept blocks
  joined by a path of the full placement gets one edge whose delay makes
  ``start(dst) - start(src)`` at least the longest such path (spans plus
  delays); edges implied by a kept block in between are left out.

  Args:
    graph: The placement.
    devices: Distinct devices of ``graph`` to keep.

  Returns:
    The subgraph, a valid ``BlockGraph`` named ``<name>.on<devices>``.
  """
  renumber = {d: i for i, d in enumerate(devices)}
  kept = [b for b in graph.blocks if renumber.keys() & set(b.devices)]
  kept_ids = {b.id for b in kept}
  order = graph.topological_order()
  reach = {b.id: _longest_from(graph, b.id, order) for b in kept}
  edges = []
  for src in kept:
    for dst, length in reach[src.id].items():
      if dst == src.id or dst not in kept_ids:
        continue
      implied = any(
          mid not in (src.id, dst) and dst in reach[mid] and
          reach[src.id][mid] + reach[mid][dst] == length
          for mid in reach[src.id] if mid in kept_ids)
      if not implied:
        edges.append(Edge(src.id, dst, length - src.span))
  blocks = tuple(
      dataclasses.replace(b, devices=tuple(
          renumber[d] for d in b.devices if d in renumber))
      for b in kept)
  return BlockGraph(name=f"{graph.name}.on{list(devices)}",
                    num_devices=len(devices), blocks=blocks,
                    edges=tuple(edges))


def _longest_from(graph: BlockGraph, source: int, order: tuple[int, ...]
                  ) -> dict[int, int]:
  """Longest start-to-start distance from ``source`` to each block it
  reaches (``order`` topological)."""
  dist = {source: 0}
  for block_id in order:
    if block_id not in dist:
      continue
    span = graph.block(block_id).span
    for e in graph.successors(block_id):
      dist[e.dst] = max(dist.get(e.dst, 0), dist[block_id] + span + e.delay)
  return dist


class Relaxation:
  """Decides periods of a placement on a relaxed model of it.

  Two relaxations keep the rules of the ``kept`` devices exactly:

  * ``pooled=False``: the subgraph of the blocks on the kept devices
    (``device_subgraph``): small, and enough wherever no block joins a kept
    device to a dropped one;
  * ``pooled=True``: every block, with the dropped devices' memory unlimited
    and their one-block-at-a-time rule relaxed to one shared pool of slots
    (``solve_modulo(pooled_devices=...)``). A block on all devices still
    needs every slot, so it cannot run beside any block of the middle
    devices: what nnshape, finetune and mllm need (nnshape, 4 devices, limit
    4: P = 31 proven infeasible in 0.36 deterministic s, the full model 0.73;
    nnshape_eager, 16 devices, limit 2: P = 121 in 9.4 s (17 s of wall
    time; the period search runs out of wall time first), where the full
    model proved nothing in 30 s).

  Feasibility of either is monotone in the period, like the full model's,
  so one proof covers every smaller period, no period at or above a
  relaxed repetend is solved again, and a proof that ran out of budget is
  tried again at or above its period only with a larger budget.

  Attributes:
    graph: The full placement.
    memory_limit: The per-device limit.
    kept: The devices whose rules are kept.
    pooled: Which relaxation (above).
    model_graph: The placement the relaxed model is built on.
  """

  def __init__(self, graph: BlockGraph, memory_limit: int, *,
               kept: tuple[int, ...] | None = None, pooled: bool = False,
               allow_wrap: bool = True, seed: int = 0):
    self.graph = graph
    self.memory_limit = memory_limit
    self.kept = kept or end_devices(graph)
    self.pooled = pooled
    if pooled:
      self.model_graph = graph
      self._pooled_devices = tuple(d for d in range(graph.num_devices)
                                   if d not in self.kept)
    else:
      self.model_graph = device_subgraph(graph, self.kept)
      self._pooled_devices = ()
    self._kept_blocks = [graph.index(b.id) for b in self.model_graph.blocks]
    self._solve_kw = dict(allow_wrap=allow_wrap, seed=seed)
    self._infeasible_up_to = 0  # proven: no repetend at any P <= this
    # Periods from this one up are not tried again: a relaxed repetend
    # exists there, so the relaxation proves nothing at or above it.
    self._feasible_from: int | None = None
    # Proofs that ran out of budget, as {period: budget}: a period at or
    # above one of them is tried again only with a larger budget (proofs
    # at larger periods are no easier). The decisive probe of the descent
    # has four times a quick probe's (nnshape_eager, 16 devices, limit 2:
    # P = 121 ran out at 3.75 s as a quick probe; the decisive probe used
    # to skip the relaxation and spend 15 s on the full model in vain).
    self._out_of_budget: dict[int, float] = {}

  def proves_infeasible(self, period: int, time_limit_s: float,
                        hint: ModuloSolution | None = None,
                        cap_s: float | None = None
                        ) -> tuple[bool, float]:
    """Whether the relaxation proves ``period`` infeasible for the placement.

    Args:
      period: The period to decide.
      time_limit_s: CP-SAT budget (deterministic seconds).
      hint: A (near) repetend of the full placement at ``period``; its
        kept blocks start the relaxed search.
      cap_s: CPU-seconds cap (``solve_modulo``).

    Returns:
      ``(proven, work)``: True if no repetend of the full placement exists
      at ``period``; the deterministic time spent.
    """
    if period <= self._infeasible_up_to:
      return True, 0.0
    if self._feasible_from is not None and period >= self._feasible_from:
      return False, 0.0
    if any(period >= tried and time_limit_s <= budget
           for tried, budget in self._out_of_budget.items()):
      return False, 0.0
    sol = solve_modulo(self.model_graph, period, self.memory_limit,
                       time_limit_s=time_limit_s, hint=self._restrict(hint),
                       horizon=latency_horizon(self.graph, period),
                       pooled_devices=self._pooled_devices,
                       cap_s=cap_s, proof_only=True,
                       **self._solve_kw)
    if sol.status == "INFEASIBLE":
      self._infeasible_up_to = period
    elif sol.found:
      self._feasible_from = min(period, self._feasible_from or period)
    else:
      self._out_of_budget[period] = max(time_limit_s,
                                        self._out_of_budget.get(period, 0.0))
    return sol.status == "INFEASIBLE", sol.work

  def _restrict(self, hint: ModuloSolution | None
                ) -> ModuloSolution | None:
    if hint is None or not hint.found:
      return None
    return dataclasses.replace(
        hint, offsets=tuple(hint.offsets[i] for i in self._kept_blocks),
        phases=tuple(hint.phases[i] for i in self._kept_blocks))


def relaxations(graph: BlockGraph, memory_limit: int | None, *,
                allow_wrap: bool = True, seed: int = 0) -> list[Relaxation]:
  """The relaxations worth trying before the full model, cheapest first.

  None without a limit (the busiest device's load decides then) or where
  the end devices are all the devices. The pooled relaxation only where a
  block joins an end device to a middle one (else the subgraph decides
  the same periods with fewer blocks).
  """
  if memory_limit is None:
    return []
  kept = end_devices(graph)
  if len(kept) == graph.num_devices:
    return []
  kw = dict(kept=kept, allow_wrap=allow_wrap, seed=seed)
  out = [Relaxation(graph, memory_limit, **kw)]
  if any(set(b.devices) & set(kept) and set(b.devices) - set(kept)
         for b in graph.blocks):
    out.append(Relaxation(graph, memory_limit, pooled=True, **kw))
  return out
