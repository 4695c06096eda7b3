"""Parameter gradients, accumulated in place inside the kernel's branch.

A kernel's gradients are added into the accumulators it owns (flat regions
per dtype, slot arrays, gathered leaves, FSDP shards per block) inside its
own switch branch or 0/1-trip loop (``passes.tick_compute``), so an
accumulator is read and written only at the ticks where a block that owns
it runs. A leaf sharded over the pipe axis comes back reduced and
re-sharded with one ``psum_scatter``. A leaf its block reads only through
static slices gets only their box added (``passes.grad_windows``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import jax.numpy as jnp
import numpy as np
from jax import lax

from . import fsdp_kernel as _fsdp_kernel
from . import fsdp_tick as _fsdp_tick
from . import grad_windows as _grad_windows
from . import indexing as _indexing
from .lower_context import LowerContext
from .tick_ctx import Ctx, scoped


def region_offset(ctx: Ctx, kernel: Any, region: Any) -> Any:
  """The kernel's flat region start: static when its devices agree."""
  offsets = np.array([region.offsets[d] for d in kernel.devices])
  if len(kernel.devices) == 1 or np.all(offsets == offsets[0]):
    return int(offsets[0])
  table = np.array([max(o, 0) for o in region.offsets])
  return _indexing.lookup(table, (ctx.dev,))


def acc_get(gacc: dict, sacc: Sequence[Sequence[Any]], key: tuple) -> Any:
  """The accumulator of ``key``: ``("flat", dtype)`` and ``("gathered",
  leaf)`` (and FSDP role keys) in ``gacc``, ``("slot", class, j)`` in
  ``sacc``."""
  if key[0] == "flat":
    return gacc[key[1]]
  if key[0] == "slot":
    return sacc[key[1]][key[2]]
  return gacc[key]


def acc_set(gacc: dict, sacc: list[list[Any]], key: tuple, value: Any
            ) -> None:
  """Stores ``value`` as the accumulator of ``key`` (see :func:`acc_get`)."""
  if key[0] == "flat":
    gacc[key[1]] = value
  elif key[0] == "slot":
    sacc[key[1]][key[2]] = value
  else:
    gacc[key] = value


def shard_grad(low: LowerContext, leaf: int, g: Any) -> Any:
  """Sums a full-shaped leaf gradient over the pipe axis, keeps the shard."""
  if leaf not in low.layout.shards:
    return g
  ax, _ = low.layout.shards[leaf]
  return lax.psum_scatter(g, low.pipe, scatter_dimension=ax, tiled=True)


@scoped("accumulate")
def accumulate(low: LowerContext, ctx: Ctx, kernel: Any,
               gvals: Sequence[Any], accs: dict[tuple, Any],
               inside: bool = False) -> None:
  """Adds one kernel's parameter gradients into ``accs`` (in place).

  Runs inside the kernel's own switch branch, so an accumulator is read
  and written only at the ticks where a block that owns it runs; other
  branches pass it through untouched (no zero-filled gradient outputs, no
  every-port add on every device). ``inside``: in an interpreted tick's
  0/1-trip loop, where FSDP gradients (per block) are reduce-scattered
  into their shard accumulators here (``passes.fsdp_kernel``).
  """
  by_leaf = {}
  for l, g in zip(kernel.grads, gvals):
    if low.reads_gathered(kernel, l):
      key = ("gathered", l)
      accs[key] = accs[key] + g.astype(accs[key].dtype)
    else:
      by_leaf[l] = shard_grad(low, l, g)
  for leaf, g in by_leaf.items():
    where = low.layout.slot_of.get((leaf, kernel.devices[0]))
    if where is None:
      continue
    key = _fsdp_kernel.acc_key(low.layout, kernel, leaf) if inside else None
    if key is not None:
      accs[key] = _fsdp_kernel.scatter_add(low.layout, ctx, kernel, leaf, g,
                                           accs[key])
      continue
    key = (_fsdp_tick.grad_key(low.layout, kernel, leaf) or
           ("slot",) + tuple(where))
    win = (low.grad_windows.get(kernel.fwd, {}).get(leaf)
           if leaf not in low.layout.shards else None)
    accs[key] = _grad_windows.add(accs[key], g.astype(accs[key].dtype), win)
  _accumulate_flat(low, ctx, kernel, by_leaf, accs)


def _accumulate_flat(low: LowerContext, ctx: Ctx, kernel: Any,
                     by_leaf: dict[int, Any], accs: dict[tuple, Any]) -> None:
  """Adds the gradients of the kernel's flat-region leaves, one region per
  dtype, into the ``("flat", dtype)`` accumulators."""
  for dt in low.layout.dtypes:
    region = low.layout.regions[dt].get(kernel.fwd)
    if region is None or not region.leaves:
      continue
    parts = [jnp.zeros((n,), dt) if by_leaf.get(l) is None
             else jnp.ravel(by_leaf[l]).astype(dt)
             for l, n in zip(region.leaves, region.sizes)]
    g = jnp.concatenate(parts) if len(parts) > 1 else parts[0]
    off = region_offset(ctx, kernel, region)
    acc = accs[("flat", dt)]
    cur = _indexing.slice_in_dim(acc, off, region.length)
    accs[("flat", dt)] = _indexing.update_slice_in_dim(acc, cur + g, off)
