"""An interp boundary's local messages, written only where they were made.

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

Where the tick's kernels each run in their own 0/1-trip loop
(``passes.predicated``), :class:`KernelWriter` goes further: each kernel's
loop writes the messages it made right after it runs, and the boundary
runs no write loop at all (fewer while loops, and fewer distinct XLA
kernels to compile).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

import jax.numpy as jnp
import numpy as np
from jax import lax

from . import indexing as _indexing
from . import stash_groups as _stash_groups
from .stash_order import Order
from .tick_ctx import Ctx, scoped
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
  round's slot. The first payload is ``select(salt, port, 0)`` (``salt``
  is 0 on the loop's one trip): with the ports alone, XLA hoists their
  stack out of the loop as invariant and builds it on every device (seen
  in the HLO); one operand that varies keeps the stack in the loop."""
  vals = [ports[ks.ports[0]] for ks in group]
  vals[0] = lax.select_n(salt, vals[0], jnp.zeros_like(vals[0]))
  tg = tick.sends[group[0].round].targets[0]
  slot = ctx.dyn(tg.slot, 0)
  if order is not None:
    slot = order.slot(slot)
  value = jnp.stack(vals).astype(stash[tg.pool].dtype)
  stash[tg.pool] = _indexing.dynamic_update_slice(
      stash[tg.pool], value, (slot,) + (0,) * (value.ndim - 1))


def _ran(tick: Any, branch: int) -> np.ndarray:
  """``(boundaries, devices)``: 1 where the kernel of ``branch`` ran at the
  tick before the boundary."""
  ticks, devices = tick.branch_of.shape
  ran = np.zeros((ticks + 1, devices), np.int32)
  ran[1:] = tick.branch_of == branch
  return ran


def _write_groups(ctx: Any, tick: Any, groups: Sequence[Sequence[Any]],
                  ports: Any, stash: list[Any], salt: Any,
                  slot_order: Order | None) -> None:
  """Writes a kernel's local rounds, grouped (``stash_groups``), into
  ``stash`` (updated); ``salt`` is a traced 0 that the payloads depend on."""
  for group in groups:
    if len(group) > 1:
      _write_stacked(ctx, tick, group, ports, stash, salt, slot_order)
      continue
    rd = tick.sends[group[0].round]
    # ``salt`` in the indices: XLA cannot hoist the select out of the
    # loop and run it on every device.
    v = _payload(ctx, rd, group[0], ports, salt)
    write_targets(ctx, rd, v, stash, 0, slot_order)


class _NextBoundary(Ctx):
  """A tick's context reading boundary tables (``(ticks + 1, devices)``)
  at boundary ``tau + 1``: row 0 dropped and looked up at ``tau``, so each
  lookup is the same XLA kernel as every other table lookup of the tick
  (a lookup at ``tau + 1`` is a kernel of its own)."""

  def table(self, values: np.ndarray, dtype: Any = jnp.int32) -> Any:
    values = np.asarray(values)
    return super().table(values[1:] if values.ndim == 2 else values, dtype)


@dataclasses.dataclass(frozen=True)
class KernelWriter:
  """Each kernel's local rounds, written inside its own 0/1-trip loop.

  A device runs one kernel per tick, so the local messages written at
  boundary ``tau + 1`` are exactly those its kernel made at tick ``tau``:
  the kernel's loop writes them right after the kernel runs, and no loop
  of their own runs at the boundary (``peer_bench``'s MLP: 2 of the outer
  loop body's 8 while loops, with their carried tuples and counters).

  Attributes:
    tick: The interp tick.
    groups: ``kid -> `` its local rounds grouped
      (``stash_groups.write_groups``), for each kernel writing any.
  """

  tick: Any
  groups: Mapping[int, Sequence[Sequence[Any]]]

  @property
  def kernels(self) -> frozenset[int]:
    """The kernels writing local rounds (their loops carry the stash)."""
    return frozenset(self.groups)

  def write(self, ctx: Any, kid: int, ports: Mapping[int, Any],
            stash: Sequence[Any], salt: Any) -> tuple[Any, ...]:
    """``stash`` with kernel ``kid``'s local rounds of tick ``ctx.tau``
    written (``ports``: its out port indices -> their new values; ``salt``
    the loop's trip counter, 0 on its one trip)."""
    stash = list(stash)
    _write_groups(_NextBoundary(ctx.dev, ctx.tau), self.tick,
                  self.groups[kid], ports, stash, salt, None)
    return tuple(stash)


def kernel_writer(tick: Any, sends: Mapping[int, Sequence[Any]],
                  pools: Sequence[Any]) -> KernelWriter:
  """The :class:`KernelWriter` of interp tick ``tick``.

  Args:
    tick: The interp tick.
    sends: ``kid -> KernelSend``s of each kernel of the tick.
    pools: The stash (for its slot shapes and sinks).
  """
  shapes = [p.shape[1:] for p in pools]
  sinks = [p.shape[0] - 1 for p in pools]
  groups = {}
  for b, kid in enumerate(tick.branches):
    mine = [ks for ks in sends.get(kid, ()) if ks.outbox < 0]
    if kid is not None and mine:
      groups[kid] = _stash_groups.write_groups(tick, mine, _ran(tick, b),
                                               shapes, sinks)
  return KernelWriter(tick, groups)


def write_locals(ctx: Any, tick: Any, ports: Sequence[Any],
                 pools: list[Any], order: Order,
                 sends: Mapping[int, Sequence[Any]]) -> None:
  """Writes the local rounds of boundary ``ctx.tau`` (``pools`` updated).

  Args:
    ctx: The lowering's context (``passes.tick_ctx.Ctx``) at the boundary.
    tick: The interp tick.
    ports: Out ports of the tick before the boundary.
    pools: The stash.
    order: Token the writes follow (the previous tick's kernel loops).
    sends: ``kid -> KernelSend``s of each kernel of the tick.
  """
  for b, kid in enumerate(tick.branches):
    mine = [ks for ks in sends.get(kid, ()) if ks.outbox < 0]
    if kid is None or not mine:
      continue
    ran = _ran(tick, b)
    trips = ctx.table(ran)
    if isinstance(trips, int) and not trips:
      continue

    # In a loop the writes follow ``order`` through the trip count; only
    # unlooped writes take it into their slots.
    slot_order = order if isinstance(trips, int) else None

    groups = _stash_groups.write_groups(
        tick, mine, ran, [p.shape[1:] for p in pools],
        [p.shape[0] - 1 for p in pools])

    def body(carry: tuple, groups: Sequence[Any] = groups) -> tuple:
      k, stash = carry
      stash = list(stash)
      _write_groups(ctx, tick, groups, ports, stash, k, slot_order)
      return k + 1, tuple(stash)

    init = (jnp.int32(0), tuple(pools))
    if isinstance(trips, int):
      _, new = body(init)
    else:
      done, new = lax.while_loop(lambda c, n=order.slot(trips): c[0] < n,
                                 body, init)
      order.follow(done)
    pools[:] = list(new)


__all__ = ["KernelWriter", "kernel_writer", "write_locals"]
