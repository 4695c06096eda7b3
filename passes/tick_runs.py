"""Segments of a tick plan lowered: straight runs, loops, interpreted ramps.

Straight runs are unrolled; a loop becomes a ``fori_loop`` whose body
unrolls one period (the micro-batch of every slot index is the iteration
plus a constant); a long ramp becomes a ``fori_loop`` over ticks whose
kernels each run in a 0/1-trip while loop (``passes.interp``,
``passes.predicated``). Within a run, local messages are written at the
next tick and remote rounds are held and written together where the
schedule needs them (``passes.flushes``); each run, loop iteration and ramp
ends by writing its last tick's messages, so no out ports cross a boundary.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from . import flushes as _flushes
from . import fsdp_kernel as _fsdp_kernel
from . import fsdp_tick as _fsdp_tick
from . import kernel_groups as _kernel_groups
from . import kernel_sends as _kernel_sends
from . import local_writes as _local_writes
from . import outbox as _outbox
from . import predicated as _predicated
from . import stash_order as _stash_order
from . import tick_compute as _compute
from . import tick_io as _io
from .lower_context import LowerContext
from .plan import Tick
from .tick_ctx import SCOPES, SEGMENT_SCOPES, Ctx


def straight(low: LowerContext, ctx: Ctx, ticks: Sequence[int],
             state: tuple, it: Any, pbuf: dict[Any, Any],
             slots: Sequence[Sequence[Any]], batch: Sequence[Any]) -> tuple:
  """Pruned ticks in order. Local messages are written at the next tick;
  remote rounds are held and written together just before the first tick
  that reads one of them (``passes.flushes``: one rendezvous where the
  schedule needs it, not one per tick); whatever is pending is written at
  the end, so nothing crosses the run's end (write before read)."""
  pools, accs, tacc = state
  pools = list(pools)
  run = list(ticks)
  ticks_of = low.plan.ticks
  pbuf = _fsdp_tick.run_scope(low.layout, pbuf, pools)  # gathers per run
  flushes = _flushes.remote_flushes(ticks_of, run)
  held: dict[int, Sequence[Any]] = {}
  # Writes ordered after the reads before them, in a loop body (its
  # carried stash must stay in place) and in unrolled ticks too: there XLA
  # copied the whole stash where a switch-free kernel's reads and a later
  # write had no data dependence, or after a loop or ramp whose reads it
  # could not see (mshape(4), N = 8: two 20 MB copies per device and step).
  order: _stash_order.Order | None = _stash_order.Order(ctx.dev)
  if isinstance(it, (int, np.integer)) and not low.switches.straight_order:
    order = None
  elif isinstance(it, (int, np.integer)):
    order.after(list(pools) + jax.tree_util.tree_leaves(accs))
  for i, t in enumerate(run):
    if i:
      _io.sends(low, ctx, ticks_of[run[i - 1]], held[i - 1], pools, it,
                remote=False, order=order)
    flush(low, ctx, run, flushes[i], held, pools, it, order)
    tick = ticks_of[t]
    accs, tacc, held[i] = _compute.compute(low, ctx, tick, pools, accs, tacc,
                                           it, pbuf, slots, batch)
    if order is not None and any(rp.kind == "pool" for rp in tick.reads):
      # One output of a switch is enough: it follows all its reads. A
      # kernel run without a switch has reads that feed only some outputs
      # or only its gradients: every output and accumulator then.
      order.after(held[i][:1] if len(tick.branches) > 1 or
                  not low.switches.straight_order else
                  list(held[i]) + jax.tree_util.tree_leaves(accs))
  if run:
    _io.sends(low, ctx, ticks_of[run[-1]], held[len(run) - 1], pools, it,
              remote=False, order=order)
    flush(low, ctx, run, flushes[-1], held, pools, it, order)
  accs = _fsdp_tick.end_run(low, ctx, pbuf, accs)  # pending scatters
  return tuple(pools), accs, tacc


def flush(low: LowerContext, ctx: Ctx, run: Sequence[int],
          positions: Sequence[int], held: dict[int, Sequence[Any]],
          pools: list[Any], it: Any,
          order: _stash_order.Order | None = None) -> None:
  """Writes the held remote rounds of the ticks at ``positions``.

  Rounds of equal payload shape whose senders and receivers are disjoint
  share one ``ppermute`` (``flushes.merge_rounds``): fewer rendezvous,
  and the merged payload depends on every tick it carries, so XLA
  cannot run the rendezvous before the latest of them.
  """
  rounds = [(j, rd) for j in positions for rd in low.plan.ticks[run[j]].sends
            if rd.remote]
  for group in _flushes.merge_rounds([rd for _, rd in rounds]):
    members = [rounds[g] for g in group]
    vals = [_io.payload(ctx, rd, held[j]) for j, rd in members]
    if len(vals) == 1:
      payload = vals[0]
    else:
      which = np.zeros(low.plan.num_devices, np.int64)
      for m, (_, rd) in enumerate(members):
        for src, _ in rd.perm:
          which[src] = m
      payload = lax.select_n(ctx.table(which), *vals)
    perm = sorted(pair for _, rd in members for pair in rd.perm)
    with jax.named_scope(SCOPES["ppermute"]):
      payload = lax.ppermute(payload, low.pipe, perm=perm)
    for _, rd in members:
      _io.write_targets(ctx, rd, payload, pools, it, order)


def _boundary(low: LowerContext, spec: Tick, sends: Any, c: Ctx,
              ports: Sequence[Any], pools: list[Any], outbox: Sequence[Any],
              order: _stash_order.Order) -> Any:
  """One boundary of an interp segment: the tick's local messages written
  (per kernel where ``sends`` is given; by the kernels' loops of the tick
  before with ``_in_loops``), its remote ones held or flushed; returns the
  outboxes."""
  copied = sends is not None and low.switches.held_in_kernels
  single = _single(low, spec, sends)
  if sends is None:
    _io.sends(low, c, spec, ports, pools, 0, remote=False, order=order)
  elif not _in_loops(low, sends):
    boxes = list(outbox) if copied else None
    _local_writes.write_locals(c, spec, ports, pools, order, sends, boxes,
                               single)
    outbox = tuple(boxes) if copied else outbox
  return _outbox.hold_and_flush(low, c, spec, ports, pools, outbox, order,
                                SCOPES["ppermute"], copied, single)


def _in_loops(low: LowerContext, sends: Any) -> bool:
  """Whether the kernels' loops write the next boundary's messages
  (``Switches.writes_in_loops``, with kernels copying their held
  messages)."""
  return (sends is not None and low.switches.held_in_kernels
          and low.switches.writes_in_loops)


def _writes(low: LowerContext, spec: Tick, sends: Any, c: Ctx,
            pools: list[Any], outbox: Sequence[Any]
            ) -> _predicated.Writes | None:
  """The writes of boundary ``c`` made in the loops of the kernels of the
  tick before it (``_in_loops``); ``None`` where they are not."""
  if not _in_loops(low, sends):
    return None
  single = _single(low, spec, sends)
  kernels = {}
  for b, kid in enumerate(spec.branches):
    kw = _local_writes.in_kernel(c, spec, b, kid, sends, pools, single)
    if kw is not None:
      kernels[b] = kw
  return _predicated.Writes(kernels, pools, list(outbox))


def _single(low: LowerContext, spec: Tick, sends: Any) -> frozenset[int]:
  """Outboxes of ``spec`` without a sink slot: with
  ``Switches.held_in_kernels``, those only kernels making a message write
  (``kernel_sends.sink_free``); else none."""
  if sends is None or not low.switches.held_in_kernels:
    return frozenset()
  return _kernel_sends.sink_free(spec, sends)


def interp(low: LowerContext, ctx: Ctx, seg: Any, state: tuple,
           pbuf: dict[Any, Any], slots: Sequence[Sequence[Any]],
           batch: Sequence[Any]) -> tuple:
  """A table-driven segment: fori_loop over its ticks (passes.interp);
  remote messages held in outboxes until a flush (passes.held)."""
  spec = low.plan.interps[seg.start]
  if low.switches.distinct_kernels:  # identical kernels: one loop body
    spec = _kernel_groups.merge(low, spec, pbuf)
  ports0 = tuple(jnp.zeros(a.shape, a.dtype) for a in spec.out_ports)
  sinks = [p.slots for p in low.plan.pools]
  sends = None
  if _kernel_sends.writes_in_kernels(spec, sinks):
    sends = {kid: _kernel_sends.kernel_sends(spec, kid, b, sinks)
             for b, kid in enumerate(spec.branches) if kid is not None}

  def body(tau: Any, carry: tuple) -> tuple:
    pools, accs, tacc, ports, outbox, token = carry
    pools = list(pools)
    c = ctx.at(tau)
    # The writes follow the previous tick's kernels (their stash reads);
    # the kernels' in-place loops follow this tick's sends (port reads).
    order = _stash_order.Order(c.dev)
    order.add(token)
    outbox = _boundary(low, spec, sends, c, ports, pools, outbox, order)
    order.after(pools)
    order.after(outbox)
    writes = _writes(low, spec, sends, ctx.at(tau + 1), pools, outbox)
    accs, tacc, ports = _compute.compute_interp(
        low, c, spec, pools, accs, tacc, pbuf, slots, batch, ports, order,
        writes)
    if writes is not None:
      outbox = tuple(writes.outbox)
    return tuple(pools), accs, tacc, ports, outbox, order.token

  state = _fsdp_kernel.with_cache(low.layout, low.plan.kernels, spec, state)
  # A while loop, not ``fori_loop`` (a scan at a static trip count): the
  # scan's body is a closed call, whose name then sat in the op_name of
  # every instruction of the segment (~4 kchars of the MLP's HLO).
  _, (pools, accs, tacc, ports, outbox, _) = lax.while_loop(
      lambda c: c[0] < seg.period, lambda c: (c[0] + 1, body(c[0], c[1])),
      (jnp.int32(0), state + (ports0,
                              _outbox.empty(spec, _single(low, spec, sends)),
                              jnp.int32(0))))
  pools, accs, tacc = _fsdp_kernel.drop_cache((pools, accs, tacc))
  pools = list(pools)
  _boundary(low, spec, sends, ctx.at(seg.period), ports, pools, outbox,
            _stash_order.Order(ctx.dev))
  return tuple(pools), accs, tacc


def loop(low: LowerContext, ctx: Ctx, seg: Any, state: tuple,
         pbuf: dict[Any, Any], slots: Sequence[Sequence[Any]],
         batch: Sequence[Any]) -> tuple:
  """A repetend: ``fori_loop`` whose body unrolls one period.

  A one-tick period whose tick adds parameter gradients is unrolled twice
  per iteration (plus one iteration after the loop when the count is
  odd): XLA writes a conditional's outputs to new buffers, so a single
  switch carrying the accumulators from the loop's input to its output
  made it copy every accumulator each tick; two switches in a row write
  back and forth without a copy.
  """
  ticks = range(seg.start, seg.start + seg.period)
  unroll = 1
  if (seg.period == 1 and seg.iterations >= 2 and
      low.acc_keys(low.plan.ticks[seg.start])):
    unroll = 2

  def loop_body(i: Any, st: tuple) -> tuple:
    for u in range(unroll):
      st = straight(low, ctx, ticks, st, i * unroll + u, pbuf, slots, batch)
    return st

  state = lax.fori_loop(0, seg.iterations // unroll, loop_body, state)
  for it in range(seg.iterations - seg.iterations % unroll, seg.iterations):
    state = straight(low, ctx, ticks, state, it, pbuf, slots, batch)
  return state


def segment(low: LowerContext, ctx: Ctx, seg: Any, state: tuple,
            pbuf: dict[Any, Any], slots: Sequence[Sequence[Any]],
            batch: Sequence[Any]) -> tuple:
  """One segment of the plan (``passes.segments``) under its scope."""
  with jax.named_scope(SEGMENT_SCOPES[seg.kind]):
    if seg.kind == "interp":
      return interp(low, ctx, seg, state, pbuf, slots, batch)
    if seg.kind == "loop":
      return loop(low, ctx, seg, state, pbuf, slots, batch)
    return straight(low, ctx, range(seg.start, seg.end), state, 0, pbuf,
                    slots, batch)
