"""Stash slots laid out so a kernel writes one micro-batch's values at once.

Every value a kernel reads lives in a *store* of ``K`` slots of its shape's
pool (``passes.plan``). Stores used to take ``K`` consecutive slots each, so
the residuals a forward kernel keeps for its backward (on ``peer_bench``'s
MLP five or six of one shape per kernel and micro-batch) went to slots ``K``
apart, one ``dynamic-update-slice`` each: a fused XLA kernel per residual
(12 of the compact MLP's 119 kernels, 14 of its 216 kchars of HLO).

Here the stores of one device that one kernel produces into one pool with
the same ``K`` form a group of ``R`` stores laid out side by side: store
``r`` of the group holds micro-batch ``m`` at ``base + r + R * (m mod K)``
(``Store.stride = R``). The group's values of one micro-batch fill ``R``
consecutive slots, so ``passes.local_writes`` writes them with one
``dynamic-update-slice`` of their stack. The pool needs as many slots as
before. Pure Python.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from .plan_ir import Aval, Pool, Store

StoreKey = tuple[Any, int]


def allocate(store_aval: Mapping[StoreKey, Aval],
             store_slots: Mapping[StoreKey, int],
             store_rows: Mapping[StoreKey, tuple[int, int] | None],
             producer: Mapping[Any, int]
             ) -> tuple[dict[StoreKey, Store], tuple[Pool, ...]]:
  """Stores (with their slots in their pools) and the pools.

  Args:
    store_aval: ``(value key, device) -> stored shape``; one pool per shape.
    store_slots: ``-> K``, slots the store needs.
    store_rows: ``-> rows`` held (None: the whole value).
    producer: ``value key -> kernel`` producing it.

  Returns:
    ``(stores, pools)``; pools numbered by first use in the order of
    ``(device, str(key))``, as the stores are grouped.
  """
  pool_ids: dict[Aval, int] = {}
  groups: dict[tuple, list[StoreKey]] = {}
  for sk in sorted(store_aval, key=lambda s: (s[1], str(s[0]))):
    pid = pool_ids.setdefault(store_aval[sk], len(pool_ids))
    group = (sk[1], pid, producer[sk[0]], store_slots[sk])
    groups.setdefault(group, []).append(sk)
  used: dict[tuple[int, int], int] = {}
  stores: dict[StoreKey, Store] = {}
  for (device, pid, _, slots), members in groups.items():
    base = used.get((pid, device), 0)
    stride = len(members)
    used[(pid, device)] = base + stride * slots
    for r, sk in enumerate(members):
      stores[sk] = Store(key=sk[0], device=device, rows=store_rows[sk],
                         aval=store_aval[sk], pool=pid, base=base + r,
                         slots=slots, stride=stride)
  pools = [None] * len(pool_ids)
  for aval, pid in pool_ids.items():
    pools[pid] = Pool(aval=aval, slots=max(
        [v for (p, _), v in used.items() if p == pid] + [0]))
  return stores, tuple(pools)




def _stackable(tick: Any, ks: Any, pool_shapes: Any) -> bool:
  """Whether round ``ks`` is a whole payload from one port into one pool."""
  rd = tick.sends[ks.round]
  if rd.rowed or len(rd.targets) != 1 or len(ks.ports) != 1:
    return False
  tg = rd.targets[0]
  return (tg.slot.is_static and not np.any(tg.row)
          and tuple(rd.payload.shape) == tuple(pool_shapes[tg.pool]))


def write_groups(tick: Any, sends: Sequence[Any], ran: np.ndarray,
                 pool_shapes: Sequence[tuple[int, ...]],
                 sinks: Sequence[int]) -> list[tuple[Any, ...]]:
  """A kernel's local rounds grouped into runs of consecutive slots.

  Args:
    tick: The interp tick.
    sends: The kernel's local ``KernelSend``s (``passes.kernel_sends``).
    ran: ``(boundaries, devices)``: where the kernel's writes run.
    pool_shapes: Per pool, one slot's shape.
    sinks: Per pool, its sink slot.

  Returns:
    Groups in write order: rounds ``g[0], g[1], ...`` of a group of two or
    more write whole payloads into one pool at slots ``s, s + 1, ...`` at
    every boundary and device in ``ran`` (no sink), so one write of their
    stack at ``g[0]``'s slot does it; every other round is alone.
  """
  mask = np.asarray(ran, bool)
  slot = {}
  for ks in sends:
    if _stackable(tick, ks, pool_shapes) and mask.any():
      tg = tick.sends[ks.round].targets[0]
      s = np.asarray(tg.slot.at(0))
      if not np.any(s[mask] == sinks[tg.pool]):
        slot[ks.round] = (tg.pool, s)
  first = tuple(np.argwhere(mask)[0]) if mask.any() else None
  chains: list[list[Any]] = []
  todo = sorted((ks for ks in sends if ks.round in slot),
                key=lambda ks: (slot[ks.round][0],
                                int(slot[ks.round][1][first])))
  for ks in todo:
    pool, s = slot[ks.round]
    if chains:
      prev_pool, prev = slot[chains[-1][-1].round]
      if pool == prev_pool and np.all((s - prev)[mask] == 1):
        chains[-1].append(ks)
        continue
    chains.append([ks])
  grouped = {ks.round: tuple(c) for c in chains if len(c) > 1 for ks in c}
  out: list[tuple[Any, ...]] = []
  for ks in sends:
    g = grouped.get(ks.round, (ks,))
    if g[0] is ks:
      out.append(g)
  return out


__all__ = ["allocate", "write_groups"]
