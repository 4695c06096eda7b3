"""The whole program: the ``shard_map`` body and ``fn(params, batch)``.

The body (one device's view) gathers what is read gathered (FSDP slots per
step, pipe-sharded leaves read on a subset), zero-fills the stash pools and
the accumulators, runs the plan's segments (``passes.tick_runs``) and
hands back the gradients (flat, per slot class, gathered leaves scattered
back; summed or reduce-scattered over the data axes) and the terminals.
``program`` wraps it in ``jax.shard_map`` (manual over the pipe and data
axes) between parameter packing and gradient unpacking.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
from jax import lax
from jax.sharding import PartitionSpec as P

from . import fsdp as _fsdp
from . import fsdp_tick as _fsdp_tick
from . import gather as _gather
from . import hoist as _hoist
from . import outputs as _outputs
from . import pack_local as _pack_local
from . import tick_runs as _runs
from . import zero_fill as _zero_fill
from .lower_context import LowerContext
from .pack_arrays import unpack_grads
from .tick_ctx import INPLACE, Ctx, scoped

_pin = _fsdp.pin  # GSPMD constraint inside the map (passes.fsdp)


def body(low: LowerContext, packed: dict[str, Any],
         slots: Sequence[Sequence[Any]], shards: Sequence[Any],
         batch: Sequence[Any], leaves: Sequence[Any] | None = None,
         workspace: bool = False) -> Any:
  """The shard_map body (one device's view); ``leaves``: the parameters
  read in place instead of ``packed`` and ``slots``; ``workspace``
  (training only): the distinct hoisted values leave the map too, last,
  concatenated over the pipe axis (``Switches.workspace``)."""
  ctx = Ctx(lax.axis_index(low.pipe))
  pbuf: dict[Any, Any] = ({INPLACE: leaves} if leaves is not None else
                          {dt: packed[dt][0] for dt in low.layout.dtypes})
  zero3 = _fsdp_tick.per_block(low.layout)
  if not zero3:
    slots = gather_fsdp(low, slots)
  for l, shard in zip(low.gathered, shards):
    pbuf[("gathered", l)] = _gather.gather(
        shard, low.layout.shards[l][0], low.layout.gathered[l].owners,
        low.num_devices, low.pipe, ctx.dev)
  hoisted = pbuf[_hoist.HOISTED] = _hoist.prepare(low, ctx, pbuf, slots)
  fills = _zero_fill.Fills(ctx.dev, low.switches.distinct_fills)
  state = _initial_state(low, slots, zero3, fills)
  for seg in low.plan.segments:
    state = _runs.segment(low, ctx, seg, state, pbuf, slots, batch)
  _, (gacc, sacc), tacc = state
  n = low.plan.num_microbatches
  if not low.train:
    return tuple(t[:n][None] for t in tacc)
  outs = _train_outputs(low, ctx, gacc, sacc, tacc, zero3)
  if workspace:
    # As computed (a 0-d value as (1,)): a reshape here would be a fusion
    # of its own, and XLA recomputes the value into it.
    return outs + (tuple(v if v.ndim else v[None]
                         for v in _hoist.distinct(hoisted)),)
  return outs


def _initial_state(low: LowerContext, slots: Sequence[Sequence[Any]],
                   zero3: bool, fills: _zero_fill.Fills) -> tuple:
  """``(pools, (flat and gathered accs, slot accs), terminal accs)``, all
  zero, each from its own fill (``passes.zero_fill``)."""
  layout, zeros = low.layout, fills.zeros
  pools = tuple(zeros((p.slots + 1,) + p.aval.shape, p.aval.dtype)
                for p in low.plan.pools)
  gacc = ({dt: zeros((layout.size[dt],), dt)
           for dt in layout.dtypes} if low.train else {})
  if low.train:
    for l in low.gathered:
      g = layout.gathered[l]
      gacc[("gathered", l)] = zeros(g.shape, g.dtype)
  sacc = (tuple((_fsdp_tick.init_accumulator(c, s[0]),) if c.fsdp and zero3
                else tuple(_pin(zeros(c.shape, c.dtype), c.inner_spec)
                           for _ in range(c.count))
                for c, s in zip(layout.classes, slots))
          if low.train else ())
  n = low.plan.num_microbatches
  tacc = tuple(
      zeros(((n + 1,) if j in low.per_mb else ()) + tuple(a.shape), a.dtype)
      for j, a in enumerate(low.ks.terminal_avals))
  return pools, (gacc, sacc), tacc


def _train_outputs(low: LowerContext, ctx: Ctx, gacc: dict,
                   sacc: Sequence[Sequence[Any]], tacc: Sequence[Any],
                   zero3: bool) -> tuple:
  """``(flat grads, slot grads, gathered grads, terminals)`` leaving the
  map, summed (or, FSDP per block, already reduced) over the data axes."""
  layout, n = low.layout, low.plan.num_microbatches
  grads = {dt: gacc[dt][None] for dt in layout.dtypes}
  sgrads = slot_grads(low, sacc, zero3)
  hgrads = tuple(_gather.scatter(
      gacc[("gathered", l)], layout.shards[l][0], layout.gathered[l].owners,
      low.num_devices, low.pipe, ctx.dev) for l in low.gathered)
  terms = tuple(t[:n][None] if j in low.per_mb else t[None]
                for j, t in enumerate(tacc))
  if low.data_axes:
    grads = {dt: lax.psum(g, low.data_axes) for dt, g in grads.items()}
    sgrads = tuple(g if c.fsdp and zero3 else
                   _fsdp.reduce_slot_grads(g, c, low.data_axes)
                   for g, c in zip(sgrads, layout.classes))
    hgrads = tuple(lax.psum(g, low.data_axes) for g in hgrads)
    terms = tuple(t if j in low.per_mb else lax.psum(t, low.data_axes)
                  for j, t in enumerate(terms))
  return grads, sgrads, hgrads, terms


def slot_grads(low: Any, sacc: Sequence[Sequence[Any]], zero3: bool = False
               ) -> tuple:
  """Per class, the slot gradient accumulators stacked ``(1, S, *shape)``
  (``low.per_slot_grads``: a tuple of ``(1, *shape)`` per slot; ``zero3``:
  FSDP classes' shard accumulators, reduced)."""
  classes = low.layout.classes
  if zero3:
    return tuple(_fsdp_tick.slot_grads(c, s[0], low.data_axes) if c.fsdp
                 else _pin(jnp.stack(s)[None], (None, None) + c.inner_spec)
                 for s, c in zip(sacc, classes))
  if low.per_slot_grads:
    return tuple(tuple(_pin(g[None], (None,) + c.inner_spec) for g in s)
                 for s, c in zip(sacc, classes))
  return tuple(_pin(jnp.stack(s)[None], (None, None) + c.inner_spec)
               for s, c in zip(sacc, classes))


@scoped("params")
def gather_fsdp(low: LowerContext, slots: Sequence[Sequence[Any]]
                ) -> list[list[Any]]:
  """FSDP slots gathered over their data axes before the first tick."""
  return _fsdp.gather_slots(slots, low.layout.classes)


def shard_spec(low: LowerContext, leaf: int) -> Any:
  """The spec handing every device its slice of a sharded leaf."""
  ax, _ = low.layout.shards[leaf]
  return P(*([None] * ax + [low.pipe]))


def map_specs(low: LowerContext) -> tuple[Any, Any]:
  """``(in_specs, out_specs)`` of the ``shard_map``: packed flat params,
  slots, pipe-sharded leaves, batch -> flat grads, slot grads, sharded
  grads, terminals (inference: terminals only)."""
  layout, pipe, data = low.layout, low.pipe, low.data_axes
  batch_spec = P(data) if data else P()
  shard_specs = tuple(shard_spec(low, l) for l in low.gathered)
  in_specs = ({dt: P(pipe) for dt in layout.dtypes},
              [[_fsdp.slot_spec(c, pipe)] * c.count for c in layout.classes],
              shard_specs,
              tuple(batch_spec for _ in low.part.traced.batch_avals))
  per_mb_spec = P(pipe, data) if data else P(pipe)
  term_specs = tuple(per_mb_spec if j in low.per_mb else P(pipe)
                     for j in range(len(low.ks.terminals)))
  if not low.train:
    return in_specs, term_specs
  slot_specs = (tuple(tuple(_fsdp.slot_spec(c, pipe)
                            for _ in range(c.count)) for c in layout.classes)
                if low.per_slot_grads else
                tuple(_fsdp.slot_spec(c, pipe, True) for c in layout.classes))
  out_specs = ({dt: P(pipe) for dt in layout.dtypes}, slot_specs,
               shard_specs, term_specs)
  return in_specs, out_specs


def program(low: Any) -> Callable[[Any, Any], Any]:
  """``fn(params, batch)`` -> ``(loss, grads)`` or outputs; to be jitted.

  Sets ``low.smap`` and ``low.map_specs`` (``tessel_jax.placed`` maps
  ``low.body`` itself, on already-placed params).
  """
  # Slot gradients leave the map one array per slot where no class is
  # FSDP: stacked per class, the stack and the unpack's slices of it were
  # two copies of every gradient, and each slice ``buf[d, j]`` its own
  # XLA kernel (per slot, ``col[d]``: the same D slices for every slot).
  low.per_slot_grads = low.train and low.layout.grads_per_slot
  in_specs, out_specs = map_specs(low)
  axes = {low.pipe, *low.data_axes}
  smap = jax.shard_map(low.body, mesh=low.mesh, in_specs=in_specs,
                       out_specs=out_specs, axis_names=axes,
                       check_vma=False)
  low.smap, low.map_specs = smap, (in_specs, out_specs)
  outputs = _outputs.Outputs(low.part, low.per_mb, low.ks.terminal_avals,
                             low.total_n)
  if low.inplace_params:
    inplace = jax.shard_map(
        lambda leaves, b: low.body({}, [], (), b, leaves=leaves),
        mesh=low.mesh, in_specs=(P(), in_specs[3]), out_specs=out_specs,
        axis_names=axes, check_vma=False)

    def run_inplace(params: Any, batch: Any) -> Any:
      bufs = inplace(tuple(jax.tree_util.tree_leaves(params)),
                     tuple(jax.tree_util.tree_leaves(batch)))
      return outputs.infer([buf.sum(axis=0) for buf in bufs])
    return run_inplace
  return _packed_run(low, smap, outputs)


def _packed_run(low: LowerContext, smap: Any, outputs: Any
                ) -> Callable[[Any, Any], Any]:
  """``run(params, batch)``: packs the params, runs ``smap``, unpacks the
  gradients onto the params' shardings (or returns the outputs)."""
  layout, mesh, pipe = low.layout, low.mesh, low.pipe

  def run(params: Any, batch: Any) -> Any:
    p_leaves = jax.tree_util.tree_leaves(params)
    b_leaves = jax.tree_util.tree_leaves(batch)
    packed, slots = _pack_local.pack(layout, p_leaves, mesh, pipe,
                                     low.data_axes)
    slots = [[_fsdp.place(mesh, a, (pipe,) + c.spec) for a in arrays]
             for arrays, c in zip(slots, layout.classes)]
    shards = tuple(p_leaves[l] for l in low.gathered)
    if not low.train:
      bufs = smap(packed, slots, shards, tuple(b_leaves))
      return outputs.infer([buf.sum(axis=0) for buf in bufs])
    gpacked, gslots, hgrads, terms = smap(packed, slots, shards,
                                          tuple(b_leaves))
    value = outputs.train([t.sum(axis=0) for t in terms])
    grads = unpack_grads(layout, gpacked, gslots, low.param_avals,
                         mesh=mesh)
    for l, g in zip(low.gathered, hgrads):
      grads[l] = grads[l] + g.astype(grads[l].dtype)
    specs = _fsdp.leaf_specs(layout)
    grads = [g if l in layout.shards else
             _fsdp.place(mesh, g, specs.get(l, ()), replicate=True)
             for l, g in enumerate(grads)]
    return value, jax.tree_util.tree_unflatten(low.part.traced.param_tree,
                                               grads)
  return run
