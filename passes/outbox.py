"""Held remote rounds of an interp segment, at run time (``passes.held``).

At each boundary of an interp segment every remote round copies this
device's payload into the round's outbox (slot 0 when the device holds a
message produced at the tick before, slot 1, a sink, otherwise); at the
round's flush boundaries (equal over the devices) one ``ppermute`` sends
every device's held message and the receivers write it into the stash. The
send runs in a while loop of 1 trip at a flush boundary and 0 elsewhere
(the trip count is the same on every device, so every device enters the
collective or none does; a while loop, not a ``cond``, so the stash is
updated in place; the payload is read at the trip counter, so XLA cannot
hoist the ``ppermute`` out of the loop).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from . import indexing as _indexing
from . import tick_io
from .stash_order import Order


def empty(tick: Any, single: frozenset[int] = frozenset()
          ) -> tuple[Any, ...]:
  """Zeroed outboxes ``(2, *payload)``, one per remote round of ``tick``
  (``(1, *payload)``, no sink slot, for the indices in ``single``)."""
  remote = [rd for rd in tick.sends if rd.remote]
  return tuple(jnp.zeros((1 if i in single else 2,) +
                         tuple(rd.payload.shape), rd.payload.dtype)
               for i, rd in enumerate(remote))


def hold_and_flush(lowering: Any, ctx: Any, tick: Any, ports: Sequence[Any],
                   pools: list[Any], outbox: Sequence[Any], order: Order,
                   scope: str, copied: bool = False,
                   single: frozenset[int] = frozenset()) -> tuple[Any, ...]:
  """One boundary of the remote rounds of interp tick ``tick``.

  Args:
    lowering: The ``passes.lower.Lowering`` (its pipe axis).
    ctx: Its context at this boundary.
    tick: The interp tick.
    ports: Out ports of the tick before the boundary.
    pools: The stash (written in place, list updated).
    outbox: The rounds' outboxes.
    order: Token the stash writes follow; the sends' trip counters are
      added to it.
    scope: Name scope of the ``ppermute``.
    copied: The payloads are already in the outboxes (copied by the
      kernels that made them, ``passes.local_writes``): only the flushes,
      and a device writes what it receives only where it is a message
      (``_receive``; else into the sink slot).
    single: Outboxes without a sink slot (``empty``): sent as they are,
      not copied out of a slot first.

  Returns:
    The outboxes after the boundary.
  """
  boxes = list(outbox)
  remote = [rd for rd in tick.sends if rd.remote]
  for i, rd in enumerate(remote):
    where = ctx.table(rd.hold)
    if not copied and not (isinstance(where, int) and where == 1):
      payload = tick_io.payload(ctx, rd, ports)
      boxes[i] = _indexing.update_index(boxes[i], payload, where)
    trips = ctx.table(rd.flush)
    if isinstance(trips, int) and not trips:
      continue
    # In a loop the stash writes follow ``order`` through the trip count
    # (equal on every device, as the collective needs); unlooped, through
    # their slots.
    slot_order = order if isinstance(trips, int) else None

    def send(carry: tuple, rd: Any = rd, one: bool = i in single) -> tuple:
      k, box, stash = carry
      stash = list(stash)
      # The payload depends on the trip counter ``k`` (0 on the one trip),
      # or XLA hoists the ppermute out of the loop as loop-invariant code
      # and runs it at every boundary: slot ``k``, or (one slot) the box
      # tied to ``k`` by a barrier (no copy).
      out = (lax.optimization_barrier((lax.reshape(box, box.shape[1:]),
                                       k))[0]
             if one else _indexing.index(box, k))
      with jax.named_scope(scope):
        got = lax.ppermute(out, lowering.pipe, perm=list(rd.perm))
      if copied:
        stash = _receive(lowering, ctx, rd, got, stash, slot_order)
      else:
        tick_io.write_targets(ctx, rd, got, stash, 0, slot_order)
      return k + 1, box, tuple(stash)

    init = (jnp.int32(0), boxes[i], tuple(pools))
    if isinstance(trips, int):
      done, boxes[i], new = send(init)
    else:
      done, boxes[i], new = lax.while_loop(
          lambda c, n=order.slot(trips): c[0] < n, send, init)
      order.follow(done)
    pools[:] = list(new)
  return tuple(boxes)


def _receive(lowering: Any, ctx: Any, rd: Any, got: Any, stash: list[Any],
             order: Order | None) -> list[Any]:
  """``stash`` with ``got`` (round ``rd``'s flush) written on the devices
  receiving a message at this boundary, in a 0/1-trip loop (the others
  received a dummy: their write into the sink slot is skipped), where at
  least half of the round's flush receipts are dummies (peer_bench's
  4-stage zbv: 65%, the loop 2.8% of its CPU); elsewhere written on every
  device as before (the loop's HLO, ~2.4 kchars a round, does not pay)."""
  sinks = [p.slots for p in lowering.plan.pools]
  real = np.zeros(rd.flush.shape, np.int32)
  for tg in rd.targets:
    real |= tg.slot.base != sinks[tg.pool]
  flushed = rd.flush[:, 0] != 0
  if real[flushed].mean() > 0.5:
    tick_io.write_targets(ctx, rd, got, stash, 0, order)
    return stash
  trips = ctx.table(real)
  if isinstance(trips, int):
    if trips:
      tick_io.write_targets(ctx, rd, got, stash, 0, order)
    return stash

  def put(carry: tuple) -> tuple:
    j, pools = carry
    pools = list(pools)
    tick_io.write_targets(ctx, rd, got, pools, 0, order)
    return j + 1, tuple(pools)

  _, new = lax.while_loop(lambda c: c[0] < trips, put,
                          (jnp.int32(0), tuple(stash)))
  return list(new)


__all__ = ["empty", "hold_and_flush"]
