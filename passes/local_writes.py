"""An interp boundary's messages, written only where they were made.

At a boundary of an interp segment every local round used to run on every
device: a select among the round's candidate out ports and a stash write,
into a sink slot where the device had nothing to store (on the README GPT's
mshape(4), 43 rounds at each of 82 boundaries on each of 4 devices; on
``peer_bench``'s MLP 6 rounds of 1 MiB, two thirds of them into the sink).
Here the rounds are grouped by the kernel that makes them
(``passes.kernel_sends``) and each group is written in a while loop of 1
trip on the devices that ran that kernel at the tick before the boundary
and 0 elsewhere: a device writes only the messages its kernel made. The
payload is taken from the out ports (never from the stash the loop
writes), and the loop's trip count follows the previous kernels' loops
(``stash_order``), so the stash is updated in place.

Held remote messages (``passes.held``) likewise: ``passes.outbox`` copied
every remote round's payload into its outbox at every boundary on every
device (slot 1, a sink, where the device held nothing: on ``peer_bench``'s
4-stage zbv two 1 MiB copies per boundary and device, about half of them
into the sink); with ``outbox`` given, the kernel that made a message
copies it into its outbox inside the same loop, on the devices that ran
it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any, NamedTuple

import jax.numpy as jnp
import numpy as np
from jax import lax

from . import indexing as _indexing
from . import stash_groups as _stash_groups
from .stash_order import Order
from .tick_ctx import scoped
from .tick_io import write_targets


def _payload(ctx: Any, rd: Any, ks: Any, ports: Sequence[Any],
             salt: Any) -> Any:
  """The message ``ks`` picks from the kernel's out ports."""
  vals = [ports[p] for p in ks.ports]
  v = vals[0]
  if len(vals) > 1:
    v = lax.select_n(ctx.table(ks.pick) + salt, *vals)
  if rd.rowed and tuple(v.shape) != tuple(rd.payload.shape):
    v = _indexing.slice_in_dim(v, ctx.table(rd.src_row) + salt,
                                rd.payload.shape[0], axis=0)
  return v


@scoped("stash_write")
def _write_stacked(ctx: Any, tick: Any, group: Sequence[Any],
                   ports: Sequence[Any], stash: list[Any], salt: Any,
                   order: Order | None) -> None:
  """Writes a group of rounds (``passes.stash_groups.write_groups``) with
  one ``dynamic-update-slice`` of their payloads' stack at the first
  round's slot. Given a ``salt`` (0 on the loop's one trip), the first
  payload is ``select(salt, port, 0)``: with the ports alone, XLA hoists
  their stack out of the loop as invariant and builds it on every device
  (seen in the HLO); one operand that varies keeps the stack in the loop.
  In the loop of the kernel computing them (``in_kernel``) they vary
  already: ``salt`` is ``None`` there."""
  vals = [ports[ks.ports[0]] for ks in group]
  if salt is not None:
    vals[0] = lax.select_n(salt, vals[0], jnp.zeros_like(vals[0]))
  tg = tick.sends[group[0].round].targets[0]
  slot = ctx.dyn(tg.slot, 0)
  if order is not None:
    slot = order.slot(slot)
  value = jnp.stack(vals).astype(stash[tg.pool].dtype)
  stash[tg.pool] = _indexing.dynamic_update_slice(
      stash[tg.pool], value, (slot,) + (0,) * (value.ndim - 1))


def write_locals(ctx: Any, tick: Any, ports: Sequence[Any],
                 pools: list[Any], order: Order,
                 sends: Mapping[int, Sequence[Any]],
                 outbox: list[Any] | None = None,
                 single: frozenset[int] = frozenset()) -> None:
  """Writes the local rounds of boundary ``ctx.tau`` (``pools`` updated).

  Args:
    ctx: The lowering's context (``passes.tick_ctx.Ctx``) at the boundary.
    tick: The interp tick.
    ports: Out ports of the tick before the boundary.
    pools: The stash.
    order: Token the writes follow (the previous tick's kernel loops).
    sends: ``kid -> KernelSend``s of each kernel of the tick.
    outbox: The remote rounds' outboxes (``passes.outbox``; updated): if
      given, each kernel's loop also copies the remote messages it made
      into slot 0 of their outboxes (``_hold``), and
      ``outbox.hold_and_flush`` is told not to.
    single: Outboxes without a sink slot (``kernel_sends.sink_free``):
      written at slot 0 without a table lookup.
  """
  for b, kid in enumerate(tick.branches):
    planned = _plan(tick, b, kid, sends, pools, outbox is not None)
    if planned is None:
      continue
    groups, held, ran = planned
    trips = ctx.table(ran)
    if isinstance(trips, int) and not trips:
      continue
    # In a loop the writes follow ``order`` through the trip count; only
    # unlooped writes take it into their slots.
    slot_order = order if isinstance(trips, int) else None

    def body(carry: tuple, groups: Sequence[Any] = groups,
             held: Sequence[Any] = held) -> tuple:
      k, stash, boxes = carry
      stash, boxes = _write(ctx, tick, groups, held, ports, stash, boxes, k,
                            slot_order, single)
      return k + 1, stash, boxes

    init = (jnp.int32(0), tuple(pools),
            tuple(outbox[ks.outbox] for ks in held))
    if isinstance(trips, int):
      _, new, boxes = body(init)
    else:
      done, new, boxes = lax.while_loop(
          lambda c, n=order.slot(trips): c[0] < n, body, init)
      order.follow(done)
    pools[:] = list(new)
    for ks, box in zip(held, boxes):
      outbox[ks.outbox] = box


class KernelWrites(NamedTuple):
  """What kernel ``kid`` writes at the boundary after it runs, done inside
  its own 0/1-trip loop (``passes.predicated``; ``Switches.writes_in_loops``).

  Attributes:
    boxes: Indices of the outboxes it copies held remote messages into.
    write: ``(ports, stash, boxes, salt) -> (stash, boxes)``: ``ports``
      every out port (the kernel's own just computed), ``stash`` the pools,
      ``boxes`` the outboxes of ``boxes``; ``salt`` the trip counter.
  """

  boxes: tuple[int, ...]
  write: Callable[..., tuple[tuple, tuple]]


def in_kernel(ctx: Any, tick: Any, b: int, kid: Any,
              sends: Mapping[int, Sequence[Any]], pools: Sequence[Any],
              single: frozenset[int] = frozenset()) -> KernelWrites | None:
  """Kernel ``kid``'s (branch ``b``) local rounds and held messages of the
  boundary ``ctx.tau`` (the one after the tick it runs at), to be written
  by its own loop: the same writes as :func:`write_locals` makes in a loop
  of its own (trip count: the devices that ran it at the tick before), one
  0/1-trip loop fewer per kernel and tick. ``None`` if it writes nothing."""
  planned = _plan(tick, b, kid, sends, pools, True)
  if planned is None:
    return None
  groups, held, _ = planned

  def write(ports: Sequence[Any], stash: Sequence[Any],
            boxes: Sequence[Any], salt: Any) -> tuple[tuple, tuple]:
    return _write(ctx, tick, groups, held, ports, stash, boxes, salt, None,
                  single, select=False)

  return KernelWrites(tuple(ks.outbox for ks in held), write)


def _plan(tick: Any, b: int, kid: Any, sends: Mapping[int, Sequence[Any]],
          pools: Sequence[Any], boxes: bool
          ) -> tuple[list, list, np.ndarray] | None:
  """``(stash write groups, held sends, ran table)`` of kernel ``kid``
  (branch ``b``) at a boundary; ``None`` if it writes nothing there.
  ``boxes``: held remote messages are copied by the kernel's loop."""
  mine = [ks for ks in sends.get(kid, ()) if ks.outbox < 0 or boxes]
  if kid is None or not mine:
    return None
  ticks, devices = tick.branch_of.shape
  held = [ks for ks in mine if ks.outbox >= 0]
  mine = [ks for ks in mine if ks.outbox < 0]
  ran = np.zeros((ticks + 1, devices), np.int32)
  ran[1:] = tick.branch_of == b
  groups = _stash_groups.write_groups(
      tick, mine, ran, [p.shape[1:] for p in pools],
      [p.shape[0] - 1 for p in pools]) if mine else []
  return groups, held, ran


def _write(ctx: Any, tick: Any, groups: Sequence[Any], held: Sequence[Any],
           ports: Sequence[Any], stash: Sequence[Any], boxes: Sequence[Any],
           k: Any, slot_order: Order | None, single: frozenset[int],
           select: bool = True) -> tuple[tuple, tuple]:
  """One kernel's writes (``_plan``) from ``ports``: its stash groups and
  its held messages; ``k`` the loop's trip counter (0 on the one trip).
  ``select``: stacked payloads tied to ``k`` (``_write_stacked``)."""
  stash = list(stash)
  for group in groups:
    if len(group) > 1:
      _write_stacked(ctx, tick, group, ports, stash, k if select else None,
                     slot_order)
      continue
    rd = tick.sends[group[0].round]
    # ``k`` (0 on the one trip) in the indices: XLA cannot hoist the
    # select out of the loop and run it on every device.
    v = _payload(ctx, rd, group[0], ports, k)
    write_targets(ctx, rd, v, stash, 0, slot_order)
  return tuple(stash), _hold(ctx, tick, held, ports, boxes, k, single)


@scoped("send")
def _hold(ctx: Any, tick: Any, held: Sequence[Any], ports: Sequence[Any],
          boxes: Sequence[Any], salt: Any, single: frozenset[int]
          ) -> tuple[Any, ...]:
  """``boxes`` with the remote messages ``held`` (a kernel's
  ``KernelSend``s of remote rounds) copied into their slot: 0 where this
  device made the message at the tick before, the sink (1) where it ran
  the kernel but made no message of that round (``Round.hold``; always 0
  in the outboxes of ``single``)."""
  out = []
  for ks, box in zip(held, boxes):
    rd = tick.sends[ks.round]
    v = _payload(ctx, rd, ks, ports, salt)
    at = salt if ks.outbox in single else ctx.table(rd.hold) + salt
    out.append(_indexing.update_index(box, v.astype(box.dtype), at))
  return tuple(out)


__all__ = ["KernelWrites", "in_kernel", "write_locals"]
