"""Interpreted ticks without a switch: each kernel in a 0/1-trip while loop.

An interp tick (``passes.interp``) used to run one ``lax.switch`` over every
kernel of its segment, with the out ports and the gradient accumulators
passed through it. XLA gives a conditional's outputs buffers of their own,
so every tick every device copied every accumulator it holds (in the branch
and again in the loop body) and zero-filled the out ports its kernel does
not produce (measured on the 2-stage MLP of ``experiments.peer_bench``,
2026-11-25: 8 MiB of accumulator copies per tick in the loop body, 8-13 MiB
per branch).

Here each kernel of the segment runs inside a ``lax.while_loop`` whose trip
count is 1 on the devices running it at this tick and 0 elsewhere. A while
loop updates its carry in place, so the carry holds only what the kernel
writes: its out ports (overwritten whole) and the accumulators it owns. A
device skips the other kernels' loops without touching their buffers: no
pass-through copy, no zero fill. Out ports a device did not write keep
stale values; every consumer masks them (sends of idle devices go to the
sink slot, terminals are masked).

XLA keeps these buffers in place only when it can order every reader of a
buffer before the loop that overwrites it, from data dependences alone;
:class:`passes.stash_order.Order` tokens provide them (a trip count or a
write slot becomes ``where(device < 0, token, value)``): each loop follows
the one before it and the next tick's stash writes follow them all (a token
of the loops' final trip counters, carried from tick to tick), and the loops
follow the tick's stash writes (a token of the pools, whose writes read the
ports). Slot accumulators are pinned to their GSPMD spec inside the loops.
Inside a loop the kernel's read indices add the trip counter (0 when the
body runs), or XLA would hoist the kernel out as loop-invariant code and
run it on every device.

With ``Switches.writes_in_loops`` (and ``held_in_kernels``) a kernel's
loop also writes the messages it made into the stash and its outboxes right
after it runs (``passes.local_writes.in_kernel``), carrying the stash and
reading its inputs from it, instead of a write loop of its own at the next
boundary: one 0/1-trip loop fewer per writing kernel.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any, NamedTuple

import jax.numpy as jnp
import numpy as np
from jax import lax

from . import fsdp_kernel as _fsdp_kernel
from .fsdp import pin
from .param_grads import acc_get as _get
from .param_grads import acc_set as _set
from .stash_order import Order


def owned_keys(lowering: Any, kernel: Any) -> tuple[tuple, ...]:
  """Accumulator keys ``param_grads.accumulate`` writes for ``kernel``."""
  if not kernel.grads:
    return ()
  layout = lowering.layout
  keys: list[tuple] = []
  for l in kernel.grads:
    if lowering.reads_gathered(kernel, l):
      keys.append(("gathered", l))
      continue
    where = layout.slot_of.get((l, kernel.devices[0]))
    if where is not None:
      # FSDP per block: the class's shard accumulator (passes.fsdp_kernel).
      keys.append(_fsdp_kernel.acc_key(layout, kernel, l) or
                  ("slot",) + tuple(where))
  for dt in layout.dtypes:
    region = layout.regions[dt].get(kernel.fwd)
    if region is not None and region.leaves:
      keys.append(("flat", dt))
  return tuple(dict.fromkeys(keys))


def _pinned(lowering: Any, key: tuple, value: Any) -> Any:
  """A slot accumulator pinned to its GSPMD spec (a loop's carry loses
  the sharding its init had: XLA gathered the weight-shaped gradient)."""
  if key[0] in ("flat", "gathered"):
    return value
  spec = _fsdp_kernel.accumulator_spec(lowering.layout, key)
  return pin(value, spec if spec is not None else
             lowering.layout.classes[key[1]].inner_spec)


def run_kernels(lowering: Any, ctx: Any, tick: Any, run_kernel: Callable,
                ports: Sequence[Any], accs: tuple, order: Order,
                writes: Writes | None = None) -> tuple[tuple, list[Any]]:
  """Runs the interp tick's kernels, each in its own 0/1-trip while loop.

  Args:
    lowering: The ``passes.lower.Lowering``.
    ctx: Its per-device context at this tick.
    tick: The interp tick.
    run_kernel: ``(kid, accs dict, salt, pools) -> outs`` runs a kernel
      (reads from ``pools``, or the tick's stash where ``None``, with
      ``salt`` added to their indices, params, call, gradients added into
      the dict in place) and returns its outputs.
    ports: The out ports (buffers reused in place).
    accs: ``(flat and gathered accumulators, slot accumulators)``.
    order: Token of what this tick must follow.
    writes: The boundary after the tick written by the kernels' loops
      (``Switches.writes_in_loops``; its pools and outboxes updated).

  Returns:
    ``(accs, ports)`` after the tick.
  """
  gacc, sacc = dict(accs[0]), [list(g) for g in accs[1]]
  ports = list(ports)
  for b, kid in enumerate(tick.branches):
    if kid is None:
      continue
    kernel = lowering.plan.kernels[kid]
    own = (owned_keys(lowering, kernel) if lowering.train else ()) + (
        _fsdp_kernel.cache_keys(lowering.layout, kernel))  # FSDP per block
    # A 0/1 table per kernel, not ``branch_of == b``: every kernel's trip
    # count is then the same lookup (one XLA kernel, not one per ``b``).
    trips = order.slot(ctx.table((tick.branch_of == b).astype(np.int32)))
    kw = writes.kernels.get(b) if writes is not None else None
    done, new_accs = _loop(lowering, tick, run_kernel, kid, own, trips,
                           ports, [_get(gacc, sacc, k) for k in own], kw,
                           writes)
    for k, v in zip(own, new_accs):
      _set(gacc, sacc, k, v)
    # What comes next (the next kernel's loop, the next tick's stash
    # writes) follows this loop: its trip counter is the token.
    order.follow(done)
  return (gacc, tuple(tuple(g) for g in sacc)), ports


class Writes(NamedTuple):
  """A boundary's writes made inside the kernels' loops of the tick before
  it (``passes.local_writes.in_kernel``).

  Attributes:
    kernels: Branch index -> its kernel's writes (absent: none).
    pools: The stash (updated in place by :func:`run_kernels`).
    outbox: The remote rounds' outboxes (likewise).
  """

  kernels: Mapping[int, Any]
  pools: list[Any]
  outbox: list[Any]


def _loop(lowering: Any, tick: Any, run_kernel: Callable, kid: int,
          own: tuple, trips: Any, ports: list[Any], kaccs: list[Any],
          kw: Any, writes: Writes | None) -> tuple[Any, tuple]:
  """Kernel ``kid``'s 0/1-trip loop (``ports`` updated in place); with
  ``kw`` (``local_writes.KernelWrites``) it also writes its messages into
  ``writes``' stash and outboxes, reading the stash it carries. Returns
  ``(final trip counter, its accumulators)``."""
  outs = tuple(tick.out_map[kid])
  boxes = kw.boxes if kw is not None else ()
  # A loop that writes nothing reads the stash as the loops before it left
  # it (the tick's stash before them would be a second buffer to keep).
  current = tuple(writes.pools) if writes is not None else None

  def body(carry: tuple) -> tuple:
    i, _, kaccs, stash, held = carry
    acc = {k: _pinned(lowering, k, v) for k, v in zip(own, kaccs)}
    # The reads depend on the trip counter (0 when the body runs), so XLA
    # cannot hoist the kernel out of the loop as loop-invariant code.
    vals = run_kernel(kid, acc, i, stash if kw is not None else current)
    new = tuple(v.astype(tick.out_ports[o].dtype)
                for o, v in zip(outs, vals))
    if kw is not None:
      full = list(ports)
      for o, v in zip(outs, new):
        full[o] = v
      stash, held = kw.write(full, stash, held, i)
    return (i + 1, new, tuple(_pinned(lowering, k, acc[k]) for k in own),
            stash, held)

  stash0 = tuple(writes.pools) if kw is not None else ()
  init = (jnp.int32(0), tuple(ports[o] for o in outs), tuple(kaccs), stash0,
          tuple(writes.outbox[j] for j in boxes))
  done, new_ports, new_accs, stash, held = lax.while_loop(
      lambda c, n=trips: c[0] < n, body, init)
  for o, v in zip(outs, new_ports):
    ports[o] = v
  if kw is not None:
    writes.pools[:] = list(stash)
    for j, box in zip(boxes, held):
      writes.outbox[j] = box
  return done, new_accs


__all__ = ["Writes", "owned_keys", "run_kernels"]
