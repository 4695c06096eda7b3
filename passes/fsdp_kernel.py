"""ZeRO-3 per block inside interpreted ticks: gathered by the kernel's loop.

An interpreted tick (``passes.interp``) is one loop body for every tick of
its segment, and each kernel of the segment runs in its own 0/1-trip while
loop (``passes.predicated``) that only the devices running it at this tick
enter. Every data replica of a pipe stage runs the same tick table (the
tables are indexed by the pipe index only), so a kernel's loop is entered
by all devices of a data group or by none: a collective over the data axes
inside it is executed by the whole group, like one outside every branch.

So with ``Layout.fsdp_mode == "per_block"`` a kernel's FSDP leaves are
gathered *inside its own loop* (one ``all_gather`` per split dimension over
the data axes) and its gradients reduce-scattered there (``scatter_add``)
into the class's shard-sized accumulator (``fsdp_tick.init_accumulator``,
carried by the loop and updated in place). A device so gathers only what
the kernel it runs reads, only at the ticks it runs it, and not again
where its previous kernel gathered the same slots (``cached_gathers``: one
gathered buffer per role carried across the segment's ticks, a static
table of where to gather): sharded parameters plus one block's gathered
parameters and gradients (``Layout.fsdp_block_bytes``), the bound
``passes.program_bytes`` predicts. (The tick-level alternative,
``fsdp_tick.before_tick``, gathers every role of every kernel of the
segment at every tick.)

Measured (``experiments.fsdp_compact_bench``, tp_bench's GPT on (pipe=2,
data=2), N = 8, load 7.8, BENCHMARKS.md): per block 0.97x the bytes of per
step at 1.14x its CPU time; without the carried buffers 0.92x the bytes
at 1.45x.

The gathered shard gets the loop's trip counter added through
``where(device < 0, counter, 0)`` (zero), so XLA cannot hoist the gather out
of its loop as loop-invariant code (it would then run at every tick on
every device).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import jax.numpy as jnp
import numpy as np
from jax import lax

from . import indexing as _indexing
from .fsdp import gather, pin, scatter
from .fsdp_tick import KEY, per_block, role


def _slot(layout: Any, ctx: Any, kernel: Any, leaf: int) -> Any:
  """The slot of ``leaf`` in its class on this device: static where the
  kernel's devices agree, else a lookup by device."""
  slots = np.zeros(layout.num_devices, np.int64)
  for d in kernel.devices:
    slots[d] = layout.slot_of[(leaf, d)][1]
  used = slots[list(kernel.devices)]
  if np.all(used == used[0]):
    return int(used[0])
  return _indexing.lookup(slots, (ctx.dev,))


def acc_key(layout: Any, kernel: Any, leaf: int) -> tuple | None:
  """The accumulator key (``param_grads.acc_get``) of ``leaf``'s gradient
  inside an interpreted tick: its class's shard accumulator
  ``("slot", class, 0)`` (per block), or None (accumulated as before)."""
  if not per_block(layout):
    return None
  r = role(layout, kernel, leaf, grads=True)
  return None if r is None else ("slot", r[0], 0)


def accumulator_spec(layout: Any, key: tuple) -> tuple | None:
  """The GSPMD spec of a shard accumulator ``("slot", class, 0)`` of a
  per-block FSDP class (``(count, *shard)``), None for other keys."""
  if key[0] != "slot" or not per_block(layout):
    return None
  cls = layout.classes[key[1]]
  return (None,) + tuple(cls.inner_spec) if cls.fsdp else None


def scatter_add(layout: Any, ctx: Any, kernel: Any, leaf: int, g: Any,
                acc: Any) -> Any:
  """``acc`` (a class's shard accumulator ``(count, *shard)``) with the
  gathered-size gradient ``g`` of ``leaf`` reduce-scattered over the
  class's data axes and added at the leaf's slot. (Data axes the class is
  not split over are summed once at the end, ``fsdp_tick.slot_grads``.)"""
  c = layout.slot_of[(leaf, kernel.devices[0])][0]
  cls = layout.classes[c]
  named = tuple(a for t in cls.fsdp for a in t)
  s = scatter(g[None], 1, cls.fsdp, cls.inner_spec, named)
  j = _slot(layout, ctx, kernel, leaf)
  cur = _indexing.index(acc, j)
  return pin(_indexing.update_index(acc, cur + s[0].astype(acc.dtype), j),
             (None,) + tuple(cls.inner_spec))


# --- reuse across ticks: one gathered buffer per role, carried ---------------
#
# A device whose consecutive FSDP kernels read the same slots (a block's
# forward then its backward, a 1F1B turn) need not gather again: each role
# ``(class, r)`` of the segment's kernels has one gathered-size buffer in the
# segment's carry (``CACHE`` keys among the flat accumulators), and a static
# table says, per (tick, device), whether the kernel running there must
# gather (the role's last gather on that device moved another slot, or none
# did yet). The gather then runs in a nested 0/1-trip loop, entered alike by
# the data group. The buffers hold one block's gathered leaves for the
# segment, what the kernel loops held anyway.

CACHE = "fsdp_cache"


def _kernel_roles(layout: Any, kernel: Any) -> dict[tuple, int]:
  """``(class, r) -> leaf`` of the kernel's FSDP parameters."""
  out = {}
  for l in kernel.params:
    r = role(layout, kernel, l)
    if r is not None:
      out[r] = l
  return out


def regather(layout: Any, kernels: Any, spec: Any
             ) -> dict[tuple, np.ndarray]:
  """Per role of the interp tick ``spec``'s kernels, ``(ticks, devices)``:
  1 where the kernel running there gathers the role (its slot differs from
  the role's last gather on that device in this segment), else 0."""
  branch_of = np.asarray(spec.branch_of)
  out: dict[tuple, np.ndarray] = {}
  last: dict[tuple, int] = {}
  for tau in range(branch_of.shape[0]):
    for d in range(branch_of.shape[1]):
      kid = spec.branches[branch_of[tau, d]]
      if kid is None:
        continue
      for r, l in _kernel_roles(layout, kernels[kid]).items():
        table = out.setdefault(r, np.zeros(branch_of.shape, np.int64))
        slot = layout.slot_of[(l, d)][1]
        if last.get((r, d)) != slot:
          table[tau, d] = 1
          last[(r, d)] = slot
  return out


def cache_keys(layout: Any, kernel: Any) -> tuple[tuple, ...]:
  """The carried buffers ``kernel`` reads (and may gather into)."""
  if not per_block(layout):
    return ()
  return tuple((CACHE,) + r for r in _kernel_roles(layout, kernel))


def with_cache(layout: Any, kernels: Any, spec: Any, state: tuple) -> tuple:
  """``state`` (``(pools, (flat accs, slot accs), terminals)``) with a
  zeroed buffer per role of the interp tick ``spec`` among the flat
  accumulators (per block, kernels in their own loops; else unchanged: a
  one-kernel interp tick runs as a plain tick, ``fsdp_tick.before_tick``)."""
  if not per_block(layout) or len(spec.branches) < 2:
    return state
  pools, (gacc, sacc), tacc = state
  gacc = dict(gacc)
  for c, r in regather(layout, kernels, spec):
    cls = layout.classes[c]
    gacc[(CACHE, c, r)] = pin(jnp.zeros(cls.shape, cls.dtype),
                              cls.inner_spec)
  return pools, (gacc, sacc), tacc


def drop_cache(state: tuple) -> tuple:
  """``state`` without the segment's gathered buffers."""
  pools, (gacc, sacc), tacc = state
  gacc = {k: v for k, v in gacc.items()
          if not (isinstance(k, tuple) and k and k[0] == CACHE)}
  return pools, (gacc, sacc), tacc


def cached_gathers(layout: Any, ctx: Any, spec: Any, kernel: Any,
                   slots: Sequence[Sequence[Any]], counter: Any,
                   acc: dict[tuple, Any], tables: dict[tuple, np.ndarray]
                   ) -> dict[tuple, Any]:
  """As :func:`gathers`, from the carried buffers in ``acc`` (updated in
  place): a role is gathered (in a nested 0/1-trip loop) only where
  ``tables`` (:func:`regather`) says so."""
  out: dict[tuple, Any] = {}
  if not per_block(layout):
    return out
  for r, l in _kernel_roles(layout, kernel).items():
    cls = layout.classes[r[0]]
    j = _slot(layout, ctx, kernel, l)
    x = (slots[r[0]][j] if isinstance(j, int) else
         lax.select_n(j, *slots[r[0]]))
    trips = ctx.table(tables[r])
    trips = jnp.asarray(trips, jnp.int32) + jnp.where(ctx.dev < 0, counter,
                                                      0)

    def body(carry: tuple, x: Any = x, cls: Any = cls) -> tuple:
      k, _ = carry
      y = x + jnp.where(ctx.dev < 0, k, 0).astype(cls.dtype)
      return k + 1, pin(gather(y, 1, cls.fsdp, cls.inner_spec)[0],
                        cls.inner_spec)

    key = (CACHE,) + r
    _, acc[key] = lax.while_loop(lambda c, n=trips: c[0] < n, body,
                                 (jnp.int32(0), acc[key]))
    out[(KEY,) + r] = acc[key]
  return out


__all__ = ["CACHE", "accumulator_spec", "acc_key", "cache_keys",
           "cached_gathers", "drop_cache", "regather", "scatter_add",
           "with_cache"]
