"""ZeRO-3 per block: FSDP slots gathered at the tick of the kernel reading them.

With ``Layout.fsdp_mode == "per_block"`` (``tj.schedule(fsdp=...)``:
``"per_block"``, or ``"auto"`` where only per block fits the memory limit,
``tessel_jax.fsdp_choice``) an FSDP slot class
(``packing.SlotClass.fsdp``) stays stored split over its data axes for the
whole step. At every tick, before the kernels run (outside every switch
branch and every 0/1-trip loop, where every device of a data group runs the
same program), each slot a kernel of the tick reads is gathered over the
data axes; after the kernels, each FSDP gradient a kernel of the tick
returned is reduce-scattered over the data axes and added into a
shard-sized accumulator. A device so holds, besides its shards, only the
gathered slots and gathered-size gradients of the tick it is running.
That is for unrolled and looped ticks; in an interpreted tick (a table-
driven loop whose kernels each run in their own 0/1-trip loop) each kernel
gathers its own leaves and reduce-scatters its gradients inside its loop
instead (``passes.fsdp_kernel``).

*Roles.* Devices run different kernels at one tick, and a kernel's leaf
sits in a different slot on each device, while the SPMD program needs one
collective for all of them. The ``r``-th leaf of class ``c`` that a kernel
reads is its gather role ``(c, r)`` (grads: its scatter role); a tick has
one collective per role that a kernel of the tick has, moving, on device
``d``, the slot of the leaf of that role of the kernel ``d`` runs (per
device tables, per ``(tick, device)`` in interpreted segments). Devices
whose kernel lacks the role gather slot 0 (unused) and add their scattered
gradient, zero (role buffers start zeroed, only kernels with the role add
to them, and every device of a data group runs the same kernel), into
slot 0.

*Reuse.* Within a straight run of ticks (unrolled, or one loop iteration's
period) a tick whose gather role moves, on every device whose kernel has
the role, the same slot as the run's last gather of that role reuses that
gathered value (no collective): a device running one block's forward and
backward back to back (a 1F1B steady state) gathers once per run, and the
buffer stays live only while those ticks last (``run_scope``). Likewise a
scatter role's gathered-size gradient buffer keeps accumulating over the
run's ticks while its slots agree and is reduce-scattered when they
change or the run ends (``end_run``).

*Order.* Inside a loop the slot read by a gather is indexed with
``where(device < 0, counter, slot)`` (the loop counter or interpreted tick;
a class of one slot adds ``where(device < 0, counter, 0)`` to it), so XLA
cannot hoist the gather out of the loop as loop-invariant code and hold
every gathered slot for the whole loop.

The gathers and scatters are ``passes.fsdp.gather`` / ``scatter`` (nested
``shard_map`` over the GSPMD axes of the leaf, so only shards move).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from .fsdp import _on_shards, gather, pin, scatter

PER_BLOCK = "per_block"
KEY = "fsdp"  # accumulator keys ``(KEY, class, role)``: a tick's role buffer
CACHE = ("fsdp", "run")  # ``pbuf`` key of a straight run's gathered slots


def per_block(layout: Any) -> bool:
  """The layout has FSDP classes gathered per block."""
  return layout.fsdp_per_block


def _fsdp_class(layout: Any, leaf: int, device: int) -> tuple[int, int] | None:
  """``(class, slot)`` of ``leaf`` on ``device`` when an FSDP slot."""
  where = layout.slot_of.get((leaf, device))
  if where is None or not layout.classes[where[0]].fsdp:
    return None
  return where


def role(layout: Any, kernel: Any, leaf: int, grads: bool = False
         ) -> tuple[int, int] | None:
  """``(class, r)``: ``leaf`` is the ``r``-th leaf of its FSDP class among
  ``kernel``'s parameters (``grads``: its gradients); None: not FSDP."""
  d = kernel.devices[0]
  where = _fsdp_class(layout, leaf, d)
  if where is None:
    return None
  c = where[0]
  same = [l for l in (kernel.grads if grads else kernel.params)
          if (_fsdp_class(layout, l, d) or (-1,))[0] == c]
  return c, same.index(leaf)


def grad_key(layout: Any, kernel: Any, leaf: int) -> tuple | None:
  """The accumulator key of ``leaf``'s gradient in ``kernel``: its tick's
  role buffer (per block), or None (accumulated as before)."""
  if not per_block(layout):
    return None
  r = role(layout, kernel, leaf, grads=True)
  return None if r is None else (KEY,) + r


def _roles(layout: Any, kernels: Any, tick: Any, grads: bool
           ) -> dict[tuple[int, int], np.ndarray]:
  """Role -> slot table (shape of ``tick.branch_of``) of the tick's kernels;
  devices without the role: slot 0."""
  return {r: t for r, (t, _) in _roles_used(layout, kernels, tick,
                                            grads).items()}


def _roles_used(layout: Any, kernels: Any, tick: Any, grads: bool
                ) -> dict[tuple[int, int], tuple[np.ndarray, np.ndarray]]:
  """Role -> ``(slot table, mask of the devices whose kernel has it)``."""
  table: dict[tuple[int, int], np.ndarray] = {}
  used: dict[tuple[int, int], np.ndarray] = {}
  branch_of = np.asarray(tick.branch_of)
  for b, kid in enumerate(tick.branches):
    if kid is None:
      continue
    kernel = kernels[kid]
    for l in (kernel.grads if grads else kernel.params):
      r = role(layout, kernel, l, grads)
      if r is None:
        continue
      if r not in table:
        table[r] = np.zeros(branch_of.shape, np.int64)
        used[r] = np.zeros(branch_of.shape, bool)
      mask = branch_of == b
      devs = np.nonzero(mask)[-1]
      slots = np.array([layout.slot_of[(l, int(d))][1] for d in devs],
                       np.int64)
      table[r][mask] = slots
      used[r] |= mask
  return {r: (table[r], used[r]) for r in sorted(table)}


def tick_keys(layout: Any, kernels: Any, tick: Any,
              keys: Sequence[tuple]) -> tuple[tuple, ...]:
  """A tick's accumulator keys with its FSDP slot keys replaced by its
  scatter roles' keys (per block)."""
  if not per_block(layout):
    return tuple(keys)
  kept = tuple(k for k in keys
               if not (k[0] == "slot" and layout.classes[k[1]].fsdp))
  return kept + tuple((KEY,) + r for r in _roles(layout, kernels, tick, True))


def _guard(ctx: Any, index: Any, counter: Any) -> Any:
  """``index`` made dependent on a traced loop ``counter`` (not hoisted)."""
  if counter is None or isinstance(counter, (int, np.integer)):
    return index
  return jnp.where(ctx.dev < 0, counter, index)


def gather_tick(layout: Any, kernels: Any, ctx: Any, tick: Any,
                slots: Sequence[Sequence[Any]], counter: Any,
                cache: dict | None = None) -> dict[tuple, Any]:
  """The tick's gathered FSDP slots: ``{(KEY, class, r): value}`` (the leaf
  whole over the data axes, split over the GSPMD axes); ``cache``: the
  run's last gather per role, reused where it moved the same slots."""
  out = {}
  for (c, r), (table, used) in _roles_used(layout, kernels, tick,
                                           False).items():
    key = (KEY, c, r)
    hit = cache.get(key) if cache is not None else None
    if hit is not None and np.array_equal(hit[0][used], table[used]):
      out[key] = hit[1]
      continue
    cls = layout.classes[c]
    j = _guard(ctx, ctx.table(table), counter)
    if isinstance(j, (int, np.integer)):
      x = slots[c][int(j)]
    elif cls.count == 1:
      # An index into one slot folds away (XLA then hoists the gather out
      # of the loop): add the guard's zero instead (one pass over a shard).
      x = slots[c][0] + _guard(ctx, 0, counter).astype(cls.dtype)
    else:  # a select, not a stacked copy of every slot
      x = lax.select_n(j, *slots[c])
    g = gather(x, 1, cls.fsdp, cls.inner_spec)
    out[key] = pin(g[0], cls.inner_spec)
    if cache is not None:
      cache[key] = (table, out[key])
  return out


def run_scope(layout: Any, pbuf: dict, state: Any) -> dict:
  """``pbuf`` for one straight run of ticks: with an empty gather cache
  (per block), so gathers are reused within the run only, and a token of
  the run's input ``state`` (an int32 scalar read from its first array):
  an unrolled run's gathers depend on it, so XLA cannot merge them with
  an earlier run's identical gathers (common subexpressions) and keep the
  gathered slots live in between."""
  if not per_block(layout):
    return pbuf
  arrays = [a for a in jax.tree_util.tree_leaves(state) if a.size]
  token = ((arrays[0][(0,) * arrays[0].ndim] != 0).astype(jnp.int32)
           if arrays else None)
  return {**pbuf, CACHE: {"token": token}}


def param(layout: Any, kernel: Any, leaf: int, gathered: dict[tuple, Any]
          ) -> Any | None:
  """``leaf`` as ``kernel`` reads it at this tick, or None if not FSDP."""
  if not per_block(layout):
    return None
  r = role(layout, kernel, leaf)
  return None if r is None else gathered[(KEY,) + r]


def role_buffers(layout: Any, kernels: Any, tick: Any) -> dict[tuple, Any]:
  """Zeroed gathered-size gradient buffers of the tick's scatter roles."""
  out = {}
  for c, r in _roles(layout, kernels, tick, True):
    cls = layout.classes[c]
    out[(KEY, c, r)] = pin(jnp.zeros(cls.shape, cls.dtype), cls.inner_spec)
  return out


def scatter_tick(layout: Any, kernels: Any, ctx: Any, tick: Any,
                 gacc: dict, sacc: list) -> None:
  """Reduce-scatters the tick's role buffers (taken out of ``gacc``) into
  the class accumulators (``_scatter``)."""
  for (c, r), table in _roles(layout, kernels, tick, True).items():
    _scatter(layout, ctx, c, table, gacc.pop((KEY, c, r)), sacc)


def _scatter(layout: Any, ctx: Any, c: int, table: np.ndarray, g: Any,
             sacc: list) -> None:
  """Reduce-scatters role buffer ``g`` of class ``c`` and adds each
  device's shard into row ``table[device]`` of ``sacc[c][0]`` (in
  place)."""
  cls = layout.classes[c]
  named = tuple(a for t in cls.fsdp for a in t)
  s = scatter(g[None], 1, cls.fsdp, cls.inner_spec, named)
  acc = sacc[c][0]
  j = ctx.table(table)
  cur = lax.dynamic_index_in_dim(acc, j, 0, keepdims=True)
  sacc[c][0] = pin(lax.dynamic_update_index_in_dim(
      acc, cur + s.astype(acc.dtype), j, 0), (None,) + cls.inner_spec)


def init_accumulator(cls: Any, shard: Any) -> Any:
  """A class's shard accumulator ``(count, *shard)``, from one stored slot
  ``(1, *shard)``."""
  return pin(jnp.zeros((cls.count,) + tuple(shard.shape[1:]), cls.dtype),
             (None,) + cls.inner_spec)


def slot_grads(cls: Any, acc: Any, data_axes: Sequence[str]) -> Any:
  """``(1, count, *shard)``: the accumulator summed over the data axes
  the class's spec does not name."""
  named = {a for t in cls.fsdp for a in t}
  rest = tuple(a for a in data_axes if a not in named)
  g = acc[None]
  if rest:
    g = _on_shards(lambda a: lax.psum(a, rest), g,
                   (None, None) + tuple(cls.inner_spec))
  return pin(g, (None, None) + cls.inner_spec)


def before_tick(lowering: Any, ctx: Any, tick: Any, it: Any,
                slots: Sequence[Sequence[Any]], gacc: dict, sacc: list,
                pbuf: dict) -> dict:
  """Per block: gathers the tick's FSDP slots (returns ``pbuf`` with them)
  and puts its role buffers into ``gacc`` (in place): zeroed, or in a run
  the pending ones whose slots agree (others scattered first)."""
  layout = lowering.layout
  if not per_block(layout):
    return pbuf
  kernels = lowering.plan.kernels
  counter = ctx.tau if ctx.tau is not None else it
  if isinstance(counter, (int, np.integer)) and CACHE in pbuf:
    counter = pbuf[CACHE]["token"]  # an unrolled run
  if lowering.train:
    cache = pbuf.get(CACHE)
    pending = cache.setdefault("grads", {}) if cache is not None else {}
    fresh = role_buffers(layout, kernels, tick)
    for (c, r), (table, used) in _roles_used(layout, kernels, tick,
                                             True).items():
      key = (KEY, c, r)
      if key in pending:
        old, was = pending.pop(key)
        both = used & was
        if np.array_equal(old[both], table[both]):
          pending[key] = (np.where(used, table, old), used | was)
          continue
        _scatter(layout, ctx, c, old, gacc.pop(key), sacc)
      gacc[key] = fresh[key]
      if cache is not None:
        pending[key] = (table, used)
  return {**pbuf, **gather_tick(layout, kernels, ctx, tick, slots, counter,
                                pbuf.get(CACHE))}


def after_tick(lowering: Any, ctx: Any, tick: Any, gacc: dict,
               sacc: list, pbuf: dict) -> None:
  """Per block, outside a run: the tick's role buffers reduce-scattered
  into ``sacc`` (in a run they stay pending until ``end_run``)."""
  if (lowering.train and per_block(lowering.layout) and
      pbuf.get(CACHE) is None):
    scatter_tick(lowering.layout, lowering.plan.kernels, ctx, tick, gacc,
                 sacc)


def end_run(lowering: Any, ctx: Any, pbuf: dict, accs: tuple) -> tuple:
  """``accs`` with the run's pending role buffers reduce-scattered."""
  cache = pbuf.get(CACHE)
  if not cache or not cache.get("grads"):
    return accs
  gacc, sacc = dict(accs[0]), [list(g) for g in accs[1]]
  for key, (table, _) in cache.pop("grads").items():
    _scatter(lowering.layout, ctx, key[1], table, gacc.pop(key), sacc)
  return gacc, tuple(tuple(g) for g in sacc)


__all__ = ["CACHE", "KEY", "PER_BLOCK", "after_tick",
           "before_tick", "end_run", "gather_tick", "run_scope",
           "grad_key", "init_accumulator", "param", "per_block",
           "role_buffers", "scatter_tick", "slot_grads", "tick_keys"]
