"""A tick's compute: its kernels, their gradients and the terminals.

An unrolled or loop tick runs one ``lax.switch`` over only the kernels
present at that tick (no switch where one kernel runs on every device);
each branch reads its own kernel's inputs from the stash (passed in
read-only) and adds its parameter gradients into the tick's accumulators
(``Tick.grads``), which the other branches pass through. An interpreted
tick runs every kernel in a 0/1-trip while loop instead
(``passes.predicated``). Either way the tick's terminal outputs (loss
parts, outputs) are then added into their accumulators.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from . import fsdp_kernel as _fsdp_kernel
from . import fsdp_tick as _fsdp_tick
from . import hoist as _hoist
from . import indexing as _indexing
from . import predicated as _predicated
from . import stash_order as _stash_order
from . import tick_io as _io
from .lower_context import LowerContext
from .param_grads import acc_get, acc_set, accumulate
from .plan import Tick
from .tick_ctx import KERNEL_PREFIX, SCOPES, Ctx, scoped


def run_kernel(low: LowerContext, ctx: Ctx, tick: Tick, kid: int,
               vals: dict[str, Any], acc: dict[tuple, Any],
               pbuf: dict[Any, Any], slots: Sequence[Sequence[Any]],
               salt: Any = None) -> Sequence[Any]:
  """Reads kernel ``kid``'s inputs from ``vals`` (the stash, the batch
  and the read indices), runs it, adds its parameter gradients into
  ``acc`` (in place) and returns its outputs. ``salt`` (a traced zero:
  the kernel runs in an interpreted tick's 0/1-trip loop) is added to the
  read indices so the kernel depends on it; there its FSDP leaves are
  gathered and their gradients reduce-scattered (``passes.fsdp_kernel``)."""
  kernel = low.plan.kernels[kid]
  index = vals["index"]
  if salt is not None:
    index = [(ix[0] + salt, ix[1]) for ix in index]
    pbuf = {**pbuf, **_fsdp_kernel.cached_gathers(
        low.layout, ctx, tick, kernel, slots, salt, acc,
        _fsdp_kernel.regather(low.layout, low.plan.kernels, tick))}
  dvals = [_io.read_port(tick.reads[p], index[p], vals["pools"],
                         vals["batch"])
           for p in tick.in_map[kid]]
  pvals = _io.params(low, ctx, kernel, pbuf, slots)
  kctx = {"row_offset": ctx.table(tick.row_offset)}
  with jax.named_scope(SCOPES["kernel"]), \
       jax.named_scope(f"{KERNEL_PREFIX}{kid}"):
    outs, gvals = _hoist.run(kernel, kctx, pvals, dvals,
                             pbuf.get(_hoist.HOISTED, {}).get(kid))
  if kernel.grads:
    accumulate(low, ctx, kernel, gvals, acc, inside=salt is not None)
  return outs


def branch(low: LowerContext, ctx: Ctx, tick: Tick, kid: int | None,
           pbuf: dict[Any, Any], slots: Sequence[Sequence[Any]],
           keys: Sequence[tuple]) -> Callable[..., Any]:
  """One switch branch: ``(stash, accs) -> (out ports, accs)``; ``stash``
  holds the pools, the batch and every read port's index."""

  def zeros_out() -> list[Any]:
    return [jnp.zeros(a.shape, a.dtype) for a in tick.out_ports]

  if kid is None:
    def idle(vals: Sequence[Any], accs: tuple) -> Any:
      del vals
      return tuple(zeros_out()), accs
    return idle

  def run(vals: dict[str, Any], accs: tuple) -> Any:
    ports = zeros_out()
    acc = dict(zip(keys, accs))
    outs = run_kernel(low, ctx, tick, kid, vals, acc, pbuf, slots)
    for o, v in zip(tick.out_map[kid], outs):
      ports[o] = v.astype(tick.out_ports[o].dtype)
    return tuple(ports), tuple(acc[k] for k in keys)
  return run


def _check_no_collective(low: LowerContext, tick: Tick, what: str,
                         runs: str) -> None:
  """Refuses a kernel reading a pipe-sharded parameter (it gathers it with
  a collective) where it ``runs`` on only some devices."""
  if any(kid is not None and low.collective(low.plan.kernels[kid])
         for kid in tick.branches):
    raise AssertionError(
        f"{what} at step {tick.step}: a kernel reading a sharded parameter"
        f" would run {runs} (its collective could hang)")


def _unpack(accs: tuple) -> tuple[dict, list[list[Any]]]:
  """``(flat/gathered accs, slot accs)`` as a dict and mutable lists."""
  return dict(accs[0]), [list(g) for g in accs[1]]


def compute_interp(low: LowerContext, ctx: Ctx, tick: Tick,
                   pools: Sequence[Any], accs: tuple, tacc: Sequence[Any],
                   pbuf: dict[Any, Any], slots: Sequence[Sequence[Any]],
                   batch: Sequence[Any], ports: Sequence[Any],
                   order: _stash_order.Order,
                   writes: _predicated.Writes | None = None) -> tuple:
  """An interp tick: every kernel in a 0/1-trip while loop updating its
  out ports and accumulators in place (``passes.predicated``); no switch,
  no pass-through copies, no zero-filled ports. ``writes``: the next
  boundary's messages written by the kernels' loops (``pools`` is then
  ``writes.pools``, updated)."""
  if len(tick.branches) == 1:
    return compute(low, ctx, tick, pools, accs, tacc, 0, pbuf, slots, batch)
  _check_no_collective(low, tick, "interp tick", "on only some devices")
  vals = {"pools": tuple(pools), "batch": tuple(batch),
          "index": _io.read_index(ctx, tick, 0)}

  def run(kid: int, acc: dict, salt: Any, stash: Any) -> Sequence[Any]:
    v = vals if stash is None else {**vals, "pools": stash}
    return run_kernel(low, ctx, tick, kid, v, acc, pbuf, slots, salt)

  # FSDP per block: each kernel gathers its own leaves inside its loop.
  accs, ports = _predicated.run_kernels(low, ctx, tick, run, ports, accs,
                                        order, writes)
  tacc = terminals(low, ctx, tick, ports, list(tacc), 0)
  return accs, tuple(tacc), tuple(ports)


def compute(low: LowerContext, ctx: Ctx, tick: Tick, pools: Sequence[Any],
            accs: tuple, tacc: Sequence[Any], it: Any, pbuf: dict[Any, Any],
            slots: Sequence[Sequence[Any]], batch: Sequence[Any]) -> tuple:
  """Reads, runs the tick's kernels (each adding its parameter gradients
  to the accumulators it owns), accumulates terminals; returns
  ``(accs, terminal accs, out ports)``."""
  gacc, sacc = _unpack(accs)
  tacc = list(tacc)
  # The stash goes into the switch and each branch reads only its own
  # kernel's inputs (a device reads nothing for the kernels it does not
  # run; in an interp tick, of all the segment's read ports).
  vals = {"pools": tuple(pools), "batch": tuple(batch),
          "index": _io.read_index(ctx, tick, it)}
  pbuf = _fsdp_tick.before_tick(low, ctx, tick, it, slots, gacc, sacc, pbuf)
  keys = _fsdp_tick.tick_keys(low.layout, low.plan.kernels, tick,
                              low.acc_keys(tick))
  acc_in = tuple(acc_get(gacc, sacc, k) for k in keys)
  branches = [branch(low, ctx, tick, kid, pbuf, slots, keys)
              for kid in tick.branches]
  if len(branches) == 1:
    out_ports, acc_out = branches[0](vals, acc_in)
  else:
    _check_no_collective(low, tick, "tick", "inside a switch")
    out_ports, acc_out = lax.switch(ctx.table(tick.branch_of), branches,
                                    vals, acc_in)
  for k, v in zip(keys, acc_out):
    acc_set(gacc, sacc, k, v)
  _fsdp_tick.after_tick(low, ctx, tick, gacc, sacc, pbuf)
  sacc = tuple(tuple(g) for g in sacc)
  tacc = terminals(low, ctx, tick, out_ports, tacc, it)
  return (gacc, sacc), tuple(tacc), tuple(out_ports)


@scoped("terminals")
def terminals(low: LowerContext, ctx: Ctx, tick: Tick,
              out_ports: Sequence[Any], tacc: list[Any], it: Any
              ) -> list[Any]:
  """Adds the tick's terminal outputs (loss parts, outputs) into ``tacc``."""
  tacc = list(tacc)
  for ta in tick.terms:
    v = out_ports[ta.port]
    summed = ta.terminal not in low.per_mb
    scale = ta.scale / (low.total_n if summed else 1)
    s = ctx.table(scale.astype(np.float64), jnp.float32)
    mask = ctx.table(ta.mask, jnp.bool_)
    v = v * jnp.asarray(s, v.dtype) if not (isinstance(s, float) and
                                            s == 1.0) else v
    if not (isinstance(mask, (bool, np.bool_)) and mask):
      v = jnp.where(mask, v, jnp.zeros_like(v))
    tacc[ta.terminal] = _add_terminal(ctx, ta, tacc[ta.terminal], v, summed,
                                      it)
  return tacc


def _add_terminal(ctx: Ctx, ta: Any, acc: Any, v: Any, summed: bool,
                  it: Any) -> Any:
  """``acc`` with ``v`` added: summed (at its rows if rowed) or at its
  micro-batch's row of a per-micro-batch buffer."""
  row = ctx.table(ta.row)
  if summed:
    if ta.rowed:
      cur = _indexing.slice_in_dim(acc, row, v.shape[0])
      return _indexing.update_slice_in_dim(acc, cur + v, row)
    return acc + v
  mb = ctx.dyn(ta.mb, it)
  starts = (mb,) + ((row,) + (0,) * (v.ndim - 1) if v.ndim else ())
  cur = _indexing.dynamic_slice(acc, starts, (1,) + v.shape)
  return _indexing.dynamic_update_slice(acc, cur + v[None], starts)
