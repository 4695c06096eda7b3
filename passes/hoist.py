"""Kernels' parameter-only work, computed once per step before the ticks.

``prepare`` runs in the ``shard_map`` body before the first segment: for
every kernel that runs at two ticks or more it traces the kernel alone,
finds its parameter-only values (``passes.param_only``: the reversed conv
weights of an input-gradient convolution, a transposed tied embedding) and
computes them from the kernel's parameter reads. Values that equal
programs compute from the same source (one slot of a slot class: every
device holds its own block's leaf there, so kernels on different devices
reading one slot share it, as they share the slot) are computed once.
``run`` is what a tick calls instead of ``kernel.fn``: it traces the
kernel again (the tick's row offset may be a constant there), checks that
the same values are parameter-only, and evaluates the kernel with them
given, so the loop body no longer holds their producers.

The values are live for the whole step: ``nbytes`` is what the memory
model adds (``passes.program_bytes``). ``Switches(hoist=False)``
(``passes.switches``) lowers a step without it, for A/B runs.
"""

from __future__ import annotations

import collections
import dataclasses
import weakref
from collections.abc import Mapping, Sequence
from typing import Any

import jax
import jax.numpy as jnp

from tessel_jax import compat

from . import fsdp_tick as _fsdp_tick
from . import hoist_users as _users
from . import param_only as _po
from . import tick_io as _io
from .lower_context import LowerContext
from .tick_ctx import INPLACE, Ctx, scoped

HOISTED = ("hoisted",)


@dataclasses.dataclass(frozen=True, eq=False)
class Prepared:
  """One kernel's hoisted values, computed before the ticks.

  Attributes:
    signature: ``param_only.Found.signature`` of the kernel's trace.
    values: The values, aligned with it.
  """

  signature: tuple
  values: tuple[Any, ...]


def _sds(v: Any) -> jax.ShapeDtypeStruct:
  return jax.ShapeDtypeStruct(tuple(v.shape), v.dtype)


#: Abstract traces of kernels (``kctx`` None), by kernel and argument
#: avals: ``placement="auto"`` prices many plans sharing one kernel set
#: (``step_build.shared``), each asking :func:`predicted_bytes`.
#:
#: Two memos, not one: a structural key exists only where the build has a
#: measured profile (``step_build._profile_keys``; None under
#: ``cost="uniform"``/``"analytic"``), and :func:`prepare` (lowering) has
#: no profile in its ``LowerContext`` at all, so it and key-less builds
#: memoise per kernel object. That memo is weak (freed with its kernel
#: set); the keyed one outlives kernel sets (its point) and so is bounded.
_TRACES: "weakref.WeakKeyDictionary[Any, dict]" = weakref.WeakKeyDictionary()
#: The same by a kernel's structural key (``predicted_bytes``' ``keys``:
#: its profile's cache key, equal for kernels doing the same work, so the
#: plans of several placements cut into the same blocks share one trace;
#: README GPT cold choice: 108 traces for ~40 distinct kernels), least
#: recently used dropped past ``SHARED_TRACES_SIZE``.
_SHARED_TRACES: collections.OrderedDict[Any, tuple] = (
    collections.OrderedDict())
SHARED_TRACES_SIZE = 512


def _trace(kernel: Any, kctx: Mapping[str, Any] | None, pvals: Sequence[Any],
           dvals: Sequence[Any], shared_key: str | None = None
           ) -> tuple[_po.Found, Any, int]:
  """``(found, out tree, leading args)``: the kernel traced on abstract
  values (``kctx`` None: its row offset as an abstract int32 argument,
  remembered per kernel and avals, or per ``shared_key`` and avals)."""
  pv, dv = [_sds(v) for v in pvals], [_sds(v) for v in dvals]
  if kctx is None:
    key = tuple((tuple(v.shape), str(v.dtype)) for v in pv + dv)
    memo = _TRACES.setdefault(kernel, {})
    if shared_key is not None:
      return _shared_trace(kernel, (shared_key, kernel.mode,
                                    len(kernel.devices), key), pv, dv, memo,
                           key)
    if key not in memo:
      memo[key] = _trace_abstract(kernel, pv, dv)
    return memo[key]
  closed, tree = compat.make_jaxpr(lambda p, d: kernel.fn(kctx, p, d),
                                   pv, dv)
  invars, _ = compat.jaxpr_io(closed)
  return _po.find(closed, invars[:len(pv)]), tree, 0


def _shared_trace(kernel: Any, key: tuple, pv: Sequence[Any],
                  dv: Sequence[Any], memo: dict, avals_key: tuple
                  ) -> tuple[_po.Found, Any, int]:
  """:func:`_trace_abstract`, remembered in ``_SHARED_TRACES``; a trace of
  this kernel (a miss there) also in its own ``memo`` under ``avals_key``,
  where :func:`prepare` (no profile keys) finds it: the build's
  :func:`predicted_bytes` traces every kernel before the step program's
  lowering asks again (README GPT mshape(4): 6 of its 10 traces). A trace
  of another kernel with the same key stays out of ``memo``: the lowering
  traces each kernel itself."""
  hit = _SHARED_TRACES.get(key)
  if hit is None:
    hit = _SHARED_TRACES[key] = memo[avals_key] = _trace_abstract(
        kernel, pv, dv)
    while len(_SHARED_TRACES) > SHARED_TRACES_SIZE:
      _SHARED_TRACES.popitem(last=False)
  else:
    _SHARED_TRACES.move_to_end(key)
  return hit


def _trace_abstract(kernel: Any, pv: Sequence[Any], dv: Sequence[Any]
                    ) -> tuple[_po.Found, Any, int]:
  """:func:`_trace` with ``kctx`` None, not remembered."""
  closed, tree = compat.make_jaxpr(
      lambda ro, p, d: kernel.fn({"row_offset": ro}, p, d),
      jax.ShapeDtypeStruct((), jnp.int32), pv, dv)
  invars, _ = compat.jaxpr_io(closed)
  return _po.find(closed, invars[1:1 + len(pv)]), tree, 1


def abstract_trace(kernel: Any, pvals: Sequence[Any], dvals: Sequence[Any]
                   ) -> tuple[Any, Any]:
  """``(closed jaxpr, out tree)`` of ``kernel`` traced on abstract values
  (its row offset an argument), remembered per kernel and avals: the
  trace :func:`prepare` makes (``passes.kernel_groups`` compares them)."""
  found, tree, _ = _trace(kernel, None, pvals, dvals)
  return found.closed, tree


def hoistable(layout: Any, num_microbatches: int, kernel: Any) -> bool:
  """A kernel whose parameter reads are the same at every tick: no FSDP
  gather per block, no pipe-sharded leaf gathered at its tick (a
  collective), run at two ticks or more."""
  if num_microbatches < 2 or not kernel.params:
    return False
  whole = len(kernel.devices) == layout.num_devices
  if any(l in layout.shards and (whole or l not in layout.gathered)
         for l in kernel.params):
    return False
  return not (_fsdp_tick.per_block(layout) and any(
      _fsdp_tick.role(layout, kernel, l) is not None for l in kernel.params))


def _source(layout: Any, kernel: Any, leaf: int, inplace: bool) -> tuple:
  """Where the kernel reads ``leaf``: kernels reading the same source see
  the same value on every device."""
  if inplace:
    return ("leaf", leaf)
  where = layout.slot_of.get((leaf, kernel.devices[0]))
  gathered = (leaf in layout.gathered and
              len(kernel.devices) < layout.num_devices)
  if gathered:  # read whole (``tick_io.params``): the same on every device
    return ("leaf", leaf)
  if where is not None:
    return ("slot",) + tuple(where)
  # Read from its block's region (``tick_io.params``): the forward and
  # backward kernels of one block read the same value.
  return ("region", kernel.fwd, leaf)


def _values(found: _po.Found, srcs: Sequence[tuple]
            ) -> list[tuple[tuple, list[Any], list[Any], Any, Any]]:
  """Per hoisted value: ``(key, equations, parameter vars read, var,
  stored)``; equal keys compute equal values on every device."""
  by_var = dict(zip(found.params, srcs))
  out = []
  for v, stored in zip(found.hoisted, found.stored):
    eqns, reads = _po.value_prelude(found, v)
    key = (tuple(by_var[p] for p in reads),
           compat.jaxpr_text(eqns, reads, [v]), stored)
    out.append((key, eqns, reads, v, stored))
  return out


@scoped("params")
def prepare(low: LowerContext, ctx: Ctx, pbuf: dict[Any, Any],
            slots: Sequence[Sequence[Any]]) -> dict[int, Prepared]:
  """Every hoistable kernel's parameter-only values, computed once (with
  ``Switches.hoist_on_users``, only on the devices whose kernels read
  them: ``passes.hoist_users``)."""
  if not low.switches.hoist:  # off for A/B runs (passes.switches)
    return {}
  found_by: dict[int, tuple[_po.Found, list[tuple]]] = {}
  values: dict[tuple, _users.Value] = {}
  for kid, kernel in sorted(low.plan.kernels.items()):
    if not hoistable(low.layout, low.plan.num_microbatches, kernel):
      continue
    pvals = _io.params(low, ctx, kernel, pbuf, slots)
    found, _, _ = _trace(kernel, None, pvals, kernel.in_avals)
    if not found.hoisted:
      continue
    srcs = [_source(low.layout, kernel, l, INPLACE in pbuf)
            for l in kernel.params]
    by_var = dict(zip(found.params, pvals))
    keys: list[tuple] = []
    devices = frozenset(kernel.devices)
    for key, eqns, reads, v, stored in _values(found, srcs):
      keys.append(key)
      if key in values:  # one value, read by kernels of more devices
        values[key] = dataclasses.replace(
            values[key], devices=values[key].devices | devices)
      else:
        values[key] = _users.Value(eqns, reads, v, stored,
                                   [by_var[p] for p in reads], devices)
    found_by[kid] = (found, keys)
  shared = _users.compute(values, ctx.dev, low.num_devices,
                          low.switches.hoist_on_users)
  return {kid: Prepared(signature=found.signature,
                        values=tuple(shared[k] for k in keys))
          for kid, (found, keys) in found_by.items()}


def distinct(prepared: Mapping[int, Prepared]) -> tuple[Any, ...]:
  """The distinct values of :func:`prepare`'s result (kernels sharing a
  value hold the same array), in kernel order."""
  seen: dict[int, Any] = {}
  for kid in sorted(prepared):
    for v in prepared[kid].values:
      seen.setdefault(id(v), v)
  return tuple(seen.values())


def predicted_bytes(kernels: Mapping[int, Any], layout: Any,
                    param_avals: Sequence[Any], num_microbatches: int,
                    inplace: bool = False, hoist: bool = True,
                    keys: Mapping[int, str] | None = None) -> int:
  """Bytes per device of the distinct values :func:`prepare` computes
  (every device computes every kernel's; live for the whole step), from
  abstract traces of the kernels; 0 where ``hoist`` is off
  (``Switches.hoist``). ``keys``: kernel id -> a key equal for kernels
  doing the same work (their profiles' cache keys): kernels of other
  kernel sets with the same key share their traces."""
  if not hoist:
    return 0
  local = layout.local_avals(param_avals)
  sizes: dict[tuple, int] = {}
  for kid, kernel in sorted(kernels.items()):
    if not hoistable(layout, num_microbatches, kernel):
      continue
    subset = len(kernel.devices) < layout.num_devices
    pvals = [param_avals[l] if subset and l in layout.gathered else local[l]
             for l in kernel.params]  # read gathered whole (tick_io.params)
    found, _, _ = _trace(kernel, None, pvals, kernel.in_avals,
                         None if keys is None else keys.get(kid))
    srcs = [_source(layout, kernel, l, inplace) for l in kernel.params]
    for key, _, _, v, _ in _values(found, srcs):
      sizes[key] = _po.nbytes(v)
  return sum(sizes.values())


def run(kernel: Any, kctx: Mapping[str, Any], pvals: Sequence[Any],
        dvals: Sequence[Any], prepared: Prepared | None
        ) -> tuple[list[Any], list[Any]]:
  """``kernel.fn(kctx, pvals, dvals)`` with its parameter-only values
  taken from ``prepared`` (computed before the ticks)."""
  if prepared is None:
    return kernel.fn(kctx, pvals, dvals)
  found, tree, _ = _trace(kernel, kctx, pvals, dvals)
  if found.signature != prepared.signature:
    return kernel.fn(kctx, pvals, dvals)  # traced differently: run it whole
  flat = _po.rest(found, list(pvals) + list(dvals), prepared.values)
  outs, grads = jax.tree_util.tree_unflatten(tree, flat)
  return list(outs), list(grads)
