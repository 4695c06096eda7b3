"""How a placement runs a chain of layers, priced: one plan's graph.

Part of the frontier (``frontier``): for a model given as per-layer costs
(:class:`ModelCosts`) and a named placement on ``pipe`` devices with ``dp``
data-parallel replicas, :func:`plan_graph` maps contiguous layer groups onto
the placement's blocks (:func:`slots`, :func:`group_layers`) and prices the
blocks, edges and fixed memory into a quantised :class:`BlockGraph` the
search runs on. No jax here.

How a placement runs a chain of layers
--------------------------------------

Every placement maps *contiguous groups* of the model's layers to its
forward blocks (:func:`slots`):

* single-chain placements (vshape, interleaved, zbv, mshape, mllm, nnshape):
  forward block ``i`` runs group ``i`` on the whole micro-batch;
* ``xshape`` (Chimera): two towers, each the whole model on half of the
  micro-batch's rows; block ``i`` of tower A and block ``i`` of tower B
  run the same group (its parameters live on both devices and their
  gradients are all-reduced between them);
* ``kshape``: two branches of ``pipe / 2`` blocks, each running the first
  ``pipe / 2`` groups on half of the rows, then the all-device join block
  runs the last group on all rows.

A block on ``k`` devices splits the rows it runs over its devices (as the
lowering does), so it takes ``1 / k`` of its group's time and stash on each.
Its parameters are replicated on its devices (the lowering's default) and
their gradients all-reduced among them, or, with ``shard_shared``, sharded
``k`` ways: each device keeps ``1 / k``, the block all-gathers them before
it runs (forward and backward) and reduce-scatters the gradient after its
backward (seconds added to the block's span; the gathered copy counts as
workspace).

Layer grouping (:func:`group_layers`) balances time: a dynamic programme
splits the layers into the placement's groups minimising the largest
``weight x group time`` (a group's weight is the share of its time the
busiest of its devices runs), then a local search moves group boundaries
one layer at a time while the largest true device load (then the sum of
squared loads) falls.

Memory of a block: a forward block adds its group's stash (rows share,
devices share) on each of its devices, its backward releases it (split
backward: ``W`` releases it, ``B`` nothing, as in the measured cost
model). Edges between blocks on different devices carry the group's
output bytes (each receiving device gets its rows' share), priced by the
``LinkModel``; the backward edge carries a gradient of the same size.

Gradient all-reduce: a ring over the ``n`` copies of a parameter (``dp``
times its copies inside one pipeline): ``2 (n - 1) / n`` of its bytes over
the link's bandwidth plus ``2 (n - 1)`` latencies; each device reduces its
own parameters and the busiest device's time is added to the step (no
overlap with compute is assumed).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence

from tessel_jax import placements as _placements
from tessel_jax.cost import quantize as _quantize
from tessel_jax.cost.link import LinkModel
from tessel_jax.graph import BlockGraph, PlacementError
from tessel_jax.search.model_costs import ModelCosts

#: Placements the frontier knows how to map a chain of layers onto.
SUPPORTED = ("vshape", "interleaved", "zbv", "mshape", "mllm", "nnshape",
             "xshape", "kshape")
_CHAINS = ("vshape", "interleaved", "zbv", "mshape", "mllm", "nnshape")

#: Link of the analytic preset: an NVLink-class accelerator link.
DEFAULT_LINK = LinkModel(10e-6, 100e9, "default")


# --- placements x layers ------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class Slot:
  """What one forward block runs: layer group ``group`` on ``rows`` of the
  micro-batch (a fraction: 1 for the whole micro-batch)."""

  group: int
  rows: float


def _forward_ids(graph: BlockGraph) -> list[int]:
  return sorted((b.id for b in graph.blocks if b.kind == "F"),
                key=lambda i: _placements.forward_index(graph.block(i)))


def slots(graph: BlockGraph, placement: str) -> tuple[dict[int, Slot], int]:
  """Forward block id -> its :class:`Slot`, and the number of layer groups.

  Raises:
    PlacementError: for a placement the frontier cannot map a chain of
      layers onto (see :data:`SUPPORTED`).
  """
  fids = _forward_ids(graph)
  n = len(fids)
  if placement in _CHAINS:
    return {b: Slot(i, 1.0) for i, b in enumerate(fids)}, n
  if placement == "xshape":
    h = n // 2
    return {b: Slot(i % h, 0.5) for i, b in enumerate(fids)}, h
  if placement == "kshape":
    h = (n - 1) // 2
    out = {b: Slot(i % h, 0.5) for i, b in enumerate(fids[:-1])}
    out[fids[-1]] = Slot(h, 1.0)
    return out, h + 1
  raise PlacementError(
      f"the frontier cannot map a chain of layers onto placement"
      f" {placement!r}; use one of {', '.join(SUPPORTED)}")


def _coefficients(graph: BlockGraph, slot_of: Mapping[int, Slot],
                  num_groups: int) -> list[list[float]]:
  """``coef[g][d]``: share of group ``g``'s time that device ``d`` runs."""
  coef = [[0.0] * graph.num_devices for _ in range(num_groups)]
  for bid, s in slot_of.items():
    devs = graph.block(bid).devices
    for d in devs:
      coef[s.group][d] += s.rows / len(devs)
  return coef


def group_layers(times: Sequence[float], graph: BlockGraph,
                 slot_of: Mapping[int, Slot], num_groups: int
                 ) -> tuple[tuple[int, int], ...]:
  """Splits layers into ``num_groups`` contiguous groups balancing time.

  Args:
    times: Seconds of each layer (forward + backward for training).
    graph: The placement.
    slot_of: Its slots (:func:`slots`).
    num_groups: Groups to make.

  Returns:
    ``(start, end)`` layer index ranges (end exclusive), one per group.

  Raises:
    PlacementError: with fewer layers than groups.
  """
  n, g = len(times), num_groups
  if n < g:
    raise PlacementError(
        f"placement {graph.name!r} needs {g} layer groups but the model has"
        f" {n} layers; use fewer devices per pipeline or a deeper model")
  coef = _coefficients(graph, slot_of, g)
  weight = [max(row) for row in coef]
  prefix = [0.0]
  for t in times:
    prefix.append(prefix[-1] + t)
  span = lambda i, j: prefix[j] - prefix[i]
  # best[k][j]: smallest bottleneck of the first j layers in k groups.
  inf = math.inf
  best = [[inf] * (n + 1) for _ in range(g + 1)]
  cut = [[0] * (n + 1) for _ in range(g + 1)]
  best[0][0] = 0.0
  for k in range(1, g + 1):
    for j in range(k, n - (g - k) + 1):
      for i in range(k - 1, j):
        value = max(best[k - 1][i], weight[k - 1] * span(i, j))
        if value < best[k][j]:
          best[k][j], cut[k][j] = value, i
  bounds = [n]
  for k in range(g, 0, -1):
    bounds.append(cut[k][bounds[-1]])
  bounds.reverse()

  def score(b: list[int]) -> tuple[float, float]:
    loads = [0.0] * graph.num_devices
    for k in range(g):
      t = span(b[k], b[k + 1])
      for d, c in enumerate(coef[k]):
        loads[d] += c * t
    return (max(loads), sum(x * x for x in loads))

  current = score(bounds)
  for _ in range(4 * n * g):
    improved = False
    for k in range(1, g):
      for step in (-1, 1):
        moved = list(bounds)
        moved[k] += step
        if not moved[k - 1] < moved[k] < moved[k + 1]:
          continue
        s = score(moved)
        if (s[0] < current[0] * (1 - 1e-12) or
            (s[0] <= current[0] * (1 + 1e-12) and
             s[1] < current[1] * (1 - 1e-12))):
          bounds, current, improved = moved, s, True
    if not improved:
      break
  return tuple((bounds[k], bounds[k + 1]) for k in range(g))


# --- one plan's graph ---------------------------------------------------------

def ring_allreduce_seconds(nbytes: float, copies: int,
                           link: LinkModel) -> float:
  """Ring all-reduce of ``nbytes`` over ``copies`` devices."""
  if copies <= 1 or nbytes <= 0:
    return 0.0
  return (2 * (copies - 1) / copies * nbytes / link.bandwidth_bytes_per_s
          + 2 * (copies - 1) * link.latency_s)


def allgather_seconds(nbytes: float, parts: int, link: LinkModel) -> float:
  """Ring all-gather (or reduce-scatter) of ``nbytes`` in ``parts`` shards."""
  if parts <= 1 or nbytes <= 0:
    return 0.0
  return ((parts - 1) / parts * nbytes / link.bandwidth_bytes_per_s
          + (parts - 1) * link.latency_s)


@dataclasses.dataclass(frozen=True)
class PlanGraph:
  """A placement x pipeline width x data parallelism, priced.

  Attributes:
    placement: Placement name.
    pipe: Devices per pipeline.
    dp: Data-parallel replicas.
    microbatches: Micro-batches each pipeline runs per step.
    groups: Layer index ranges per group.
    group_names: First and last layer name of each group.
    quantized: The priced graph (``quantized.graph`` is what the search
      runs on) with real seconds, bytes and delays.
    fixed_bytes: Per device: parameters, gradients, optimiser state and
      workspace (gathered shards).
    param_bytes: Per device: parameter bytes alone.
    allreduce_seconds: Gradient all-reduce time added to every step.
  """

  placement: str
  pipe: int
  dp: int
  microbatches: int
  groups: tuple[tuple[int, int], ...]
  group_names: tuple[str, ...]
  quantized: _quantize.Quantized
  fixed_bytes: tuple[int, ...]
  param_bytes: tuple[int, ...]
  allreduce_seconds: float

  @property
  def graph(self) -> BlockGraph:
    return self.quantized.graph

  @property
  def label(self) -> str:
    return f"{self.placement} pipe{self.pipe} dp{self.dp}"

  def stash_limit_units(self, limit_bytes: int | None) -> int | None:
    """Memory units left for the stash on the fullest device (None: none).

    Negative when the fixed bytes alone exceed ``limit_bytes``.
    """
    if limit_bytes is None:
      return None
    free = int(limit_bytes) - max(self.fixed_bytes)
    return free // self.quantized.memory_unit


def plan_graph(model: ModelCosts, placement: str, pipe: int, dp: int, *,
               microbatches: int, link: LinkModel = DEFAULT_LINK,
               optimizer_slots: int = 2, shard_shared: bool = False,
               memory_units: int = _quantize.MEMORY_UNITS,
               mode: str = "train") -> PlanGraph:
  """Prices ``placement`` on ``pipe`` devices for ``model`` (see the module
  docstring for the rules).

  Args:
    model: Per-layer costs.
    placement: A name of :data:`SUPPORTED`.
    pipe: Devices per pipeline.
    dp: Data-parallel replicas.
    microbatches: Micro-batches of the whole step (divided over ``dp``).
    link: Communication model (activations, gradients, gathers).
    optimizer_slots: Parameter-sized optimiser arrays (Adam: 2).
    shard_shared: Shard the parameters of multi-device blocks.
    memory_units: The largest block stash becomes this many units.
    mode: ``"train"``, or ``"infer"``: forward blocks only (no stash, no
      gradients: the fixed bytes are the parameters, nothing is
      all-reduced; groups balance the forward times).

  Raises:
    PlacementError: for an unsupported placement or device count, or a
      model with fewer layers than the placement's groups.
    ValueError: when ``microbatches`` does not divide over ``dp``.
  """
  _check_args(mode, pipe, dp, microbatches)
  train = mode == "train"
  base = _placements.get(placement, pipe, mode=mode)
  slot_of, num_groups = slots(base, placement)
  layers = model.layers
  times = [l.forward_s + (l.backward_s if train else 0.0) for l in layers]
  groups = group_layers(times, base, slot_of, num_groups)
  sums = _GroupSums.of(layers, groups)
  fwd_of = _placements.backward_of(base)   # B/W id -> F id
  seconds, memory = _block_costs(base, slot_of, fwd_of, sums, train, link,
                                 shard_shared)
  q = _quantize.quantize(base, seconds, memory,
                         _edge_delays(base, slot_of, fwd_of, sums, link),
                         memory_units=memory_units)
  params, workspace, allreduce = _fixed(
      _holders(base, slot_of, num_groups), sums, pipe, dp, train, link,
      shard_shared)
  per_param = 2 + optimizer_slots if train else 1
  fixed = tuple(p * per_param + w for p, w in zip(params, workspace))
  names = tuple(layers[a].name if b - a == 1 else
                f"{layers[a].name}..{layers[b - 1].name}" for a, b in groups)
  return PlanGraph(placement=placement, pipe=pipe, dp=dp,
                   microbatches=microbatches // dp, groups=groups,
                   group_names=names, quantized=q, fixed_bytes=fixed,
                   param_bytes=tuple(params),
                   allreduce_seconds=max(allreduce))


def _check_args(mode: str, pipe: int, dp: int, microbatches: int) -> None:
  """Refuses a mode, device count or micro-batch count :func:`plan_graph`
  cannot price."""
  if mode not in _placements.MODES:
    raise ValueError(f"mode is {mode!r}; use 'train' or 'infer'")
  if dp < 1 or pipe < 1:
    raise ValueError(f"pipe and dp must be >= 1, got pipe={pipe}, dp={dp}")
  if microbatches % dp:
    raise ValueError(f"{microbatches} micro-batches do not divide over {dp}"
                     " data-parallel replicas")


@dataclasses.dataclass(frozen=True)
class _GroupSums:
  """Per layer group: its layers' forward and backward seconds,
  activation (stash) and parameter bytes, and its last layer's output
  bytes (what an edge out of it carries)."""

  forward_s: tuple[float, ...]
  backward_s: tuple[float, ...]
  activation: tuple[int, ...]
  params: tuple[int, ...]
  output: tuple[int, ...]

  @classmethod
  def of(cls, layers: Sequence, groups: Sequence[tuple[int, int]]
         ) -> _GroupSums:
    def total(field: str) -> tuple:
      return tuple(sum(getattr(l, field) for l in layers[a:b])
                   for a, b in groups)
    return cls(forward_s=total("forward_s"), backward_s=total("backward_s"),
               activation=total("activation_bytes"),
               params=total("param_bytes"),
               output=tuple(layers[b - 1].output_bytes for _, b in groups))


def _block_costs(base: BlockGraph, slot_of: Mapping[int, Slot],
                 fwd_of: Mapping[int, int], sums: _GroupSums, train: bool,
                 link: LinkModel, shard_shared: bool
                 ) -> tuple[dict[int, float], dict[int, int]]:
  """Seconds and stash bytes of every block (module docstring)."""
  split_w = {f for b, f in fwd_of.items() if base.block(b).kind == "W"}
  seconds: dict[int, float] = {}
  memory: dict[int, int] = {}
  for blk in base.blocks:
    fid = blk.id if blk.kind == "F" else fwd_of[blk.id]
    s = slot_of[fid]
    k = len(blk.devices)
    sharded = shard_shared and k > 1
    gather = (allgather_seconds(sums.params[s.group], k, link) if sharded
              else 0.0)
    stash = int(math.ceil(s.rows * sums.activation[s.group] / k))
    if blk.kind == "F":
      seconds[blk.id] = s.rows * sums.forward_s[s.group] / k + gather
      memory[blk.id] = stash if train else 0
    else:
      share = 0.5 if fid in split_w else 1.0
      extra = gather if blk.kind == "B" else 0.0
      if sharded and (blk.kind == "W" or fid not in split_w):
        extra += allgather_seconds(sums.params[s.group], k, link)  # reduce-scatter
      seconds[blk.id] = share * s.rows * sums.backward_s[s.group] / k + extra
      # Split backward: W frees the stash (it needs the activations), B
      # frees nothing (as in tessel_jax.cost.model.block_memory_bytes).
      memory[blk.id] = 0 if (fid in split_w and blk.kind == "B") else -stash
    if seconds[blk.id] <= 0:
      raise ValueError(f"block {blk.label} of {base.name} has no time; give"
                       " every layer backward_s > 0 for training")
  return seconds, memory


def _edge_delays(base: BlockGraph, slot_of: Mapping[int, Slot],
                 fwd_of: Mapping[int, int], sums: _GroupSums,
                 link: LinkModel) -> dict[tuple[int, int], float]:
  """Seconds of every edge between blocks on different devices: the
  source group's output, each receiving device its rows' share."""
  delays: dict[tuple[int, int], float] = {}
  for e in base.edges:
    src, dst = base.block(e.src), base.block(e.dst)
    if set(src.devices) == set(dst.devices):
      continue
    # The forward edge u -> v and its backward v' -> u' carry u's output.
    fu = e.src if src.kind == "F" else fwd_of[e.dst]
    su = slot_of[fu]
    delays[(e.src, e.dst)] = link.seconds(
        int(math.ceil(su.rows * sums.output[su.group] / len(dst.devices))))
  return delays


def _holders(base: BlockGraph, slot_of: Mapping[int, Slot],
             num_groups: int) -> dict[int, list[tuple[int, ...]]]:
  """Per group, the device sets of the blocks running it."""
  holders: dict[int, list[tuple[int, ...]]] = {g: [] for g in range(num_groups)}
  for bid, s in slot_of.items():
    holders[s.group].append(base.block(bid).devices)
  return holders


def _fixed(holders: Mapping[int, list[tuple[int, ...]]], sums: _GroupSums,
           pipe: int, dp: int, train: bool, link: LinkModel,
           shard_shared: bool) -> tuple[list[int], list[int], list[float]]:
  """Per device: parameter bytes held, gathered workspace bytes and
  gradient all-reduce seconds (module docstring)."""
  params = [0] * pipe
  workspace = [0] * pipe
  allreduce = [0.0] * pipe
  for g, devsets in holders.items():
    sets = list(dict.fromkeys(devsets))        # distinct device sets
    union = sorted({d for devs in sets for d in devs})
    for d in union:
      k = max(len(devs) for devs in sets if d in devs)
      sharded = shard_shared and k > 1
      own = int(math.ceil(sums.params[g] / k)) if sharded else sums.params[g]
      params[d] += own
      if sharded:
        workspace[d] = max(workspace[d], sums.params[g] - own)
      # Sharded: a shard's copies are one per device set and replica;
      # replicated: every holder and replica has the whole group.
      copies = dp * (len(sets) if sharded else len(union))
      if train:
        allreduce[d] += ring_allreduce_seconds(own, copies, link)
  return params, workspace, allreduce
