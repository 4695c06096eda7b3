"""One tick's reads and writes: messages into the stash, ports and params out.

A round's payload is what a device sends (one of the round's candidate
out ports, rows selected when rowed); its targets are stash slots written
with ``dynamic_update_slice`` at per-device indices. A kernel's read ports
are read inside its own branch; its parameters come from its slots, its
flat regions, the leaves gathered before the first tick, or (a leaf
sharded over the pipe axis) one ``all_gather`` at its tick.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import jax
from jax import lax

from . import fsdp as _fsdp
from . import fsdp_tick as _fsdp_tick
from . import stash_order as _stash_order
from .lower_context import LowerContext
from .pack_arrays import read_region
from .param_grads import region_offset
from .plan import Tick
from .tick_ctx import INPLACE, SCOPES, Ctx, read, read_rows, scoped, write


@scoped("send")
def payload(ctx: Ctx, rd: Any, ports: Sequence[Any]) -> Any:
  """What this device sends in round ``rd`` (before any ``ppermute``)."""
  rows = rd.payload.shape[0] if rd.payload.shape else 0
  vals = []
  for c in rd.candidates:
    v = ports[c]
    if rd.rowed and tuple(v.shape) != rd.payload.shape:
      v = read_rows(v, ctx.table(rd.src_row), rows)
    vals.append(v)
  if len(vals) == 1:
    return vals[0]
  return lax.select_n(ctx.table(rd.cand), *vals)


@scoped("stash_write")
def write_targets(ctx: Ctx, rd: Any, value: Any, pools: list[Any], it: Any,
                  order: _stash_order.Order | None = None) -> None:
  """Writes ``value`` (round ``rd``'s payload) into its stash targets."""
  for tg in rd.targets:
    slot = ctx.dyn(tg.slot, it)
    if order is not None:
      slot = order.slot(slot)
    pools[tg.pool] = write(pools[tg.pool], value, slot, ctx.table(tg.row))


def sends(low: LowerContext, ctx: Ctx, tick: Tick, ports: Sequence[Any],
          pools: list[Any], it: Any, remote: bool | None = None,
          order: _stash_order.Order | None = None) -> None:
  """Writes the tick's rounds (only the remote or local ones if given)."""
  for rd in tick.sends:
    if remote is not None and rd.remote != remote:
      continue
    value = payload(ctx, rd, ports)
    if rd.remote:
      with jax.named_scope(SCOPES["ppermute"]):
        value = lax.ppermute(value, low.pipe, perm=list(rd.perm))
    write_targets(ctx, rd, value, pools, it, order)


def read_index(ctx: Ctx, tick: Tick, it: Any) -> list[tuple]:
  """``(slot or row start, row)`` of each read port of the tick."""
  return [(ctx.dyn(rp.index, it),
           ctx.table(rp.row) if rp.kind == "pool" else 0)
          for rp in tick.reads]


@scoped("stash_read")
def read_port(rp: Any, index: tuple, pools: Sequence[Any],
              batch: Sequence[Any]) -> Any:
  """One read port's value (inside the branch of a kernel reading it)."""
  if rp.kind == "pool":
    return read(pools[rp.source], index[0], index[1], rp.aval.shape)
  return read_rows(batch[rp.source], index[0], rp.aval.shape[0])


@scoped("params")
def params(low: LowerContext, ctx: Ctx, kernel: Any, pbuf: dict[Any, Any],
           slots: Sequence[Sequence[Any]]) -> list[Any]:
  """The kernel's parameter values, in ``kernel.params`` order."""
  if INPLACE in pbuf:
    return [pbuf[INPLACE][l] for l in kernel.params]
  by_leaf = _slot_params(low, kernel, pbuf, slots)
  for dt in low.layout.dtypes:
    region = low.layout.regions[dt].get(kernel.fwd)
    if region is None or not region.leaves:
      continue
    off = region_offset(ctx, kernel, region)
    for l, v in zip(region.leaves,
                    read_region(pbuf[dt], region, low.local_avals, off)):
      by_leaf[l] = v
  out = []
  for l in kernel.params:
    if low.reads_gathered(kernel, l):
      out.append(pbuf[("gathered", l)])
      continue
    v = by_leaf[l]
    if l in low.layout.shards:
      ax, _ = low.layout.shards[l]
      v = lax.all_gather(v, low.pipe, axis=ax, tiled=True)
    out.append(v)
  return out


def _slot_params(low: LowerContext, kernel: Any, pbuf: dict[Any, Any],
                 slots: Sequence[Sequence[Any]]) -> dict[int, Any]:
  """Leaf -> value of the kernel's leaves held in slots (or gathered per
  block by ``passes.fsdp_tick``), pinned to their GSPMD spec."""
  layout = low.layout
  by_leaf: dict[int, Any] = {}
  for l in kernel.params:
    where = layout.slot_of.get((l, kernel.devices[0]))
    v = _fsdp_tick.param(layout, kernel, l, pbuf)  # ZeRO-3 per block
    if v is not None:
      by_leaf[l] = v
    elif where is not None and not low.reads_gathered(kernel, l):
      c, j = where
      if any(layout.slot_of[(l, d)] != where for d in kernel.devices):
        raise AssertionError("a shared block's leaf sits in different slots")
      by_leaf[l] = _fsdp.pin(slots[c][j][0], layout.classes[c].inner_spec)
  return by_leaf
