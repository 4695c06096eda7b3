"""Identical kernels of an interpreted segment lowered as one loop body.

An interp tick (``passes.interp``) runs each kernel of its segment in its
own 0/1-trip while loop (``passes.predicated``). Kernels of identical
blocks on different devices (the README GPT's mshape(4): the forward
kernels of its three one-layer blocks, on devices 0, 1 and 2) are then
lowered, traced and compiled once each although they are the same
computation: each device holds its own block's parameters in the same
slots of a slot class, and the segment's ports are shared by class
(``tick_tables.assign_inputs``), so their loop bodies are the same program.

:func:`merge` gives such kernels one branch of the interp tick (the
lowest kernel id of the group, its representative): ``branch_of`` points
every device running any of them at that branch, so one loop whose trip
count is 1 wherever one of them runs holds one body. Every per-kernel
choice left (stash slots, rows, message routes, terminal masks) is
already a ``(tick, device)`` table; the group's kernel sends come from the
merged branch (``passes.kernel_sends``).

Two kernels are merged only where the lowering cannot tell them apart on
the device running them: equal jaxpr text (abstract trace, row offset an
argument) and constants, equal out tree, every parameter read from the
same slot (no flat region, gathered, pipe-sharded or FSDP leaf, no
in-place leaves), equal gradient positions and windows, equal accumulator
keys, equal in and out ports, the same rounds written from the same ports
(``passes.kernel_sends``), and the same hoisted values
(``passes.hoist``: shared by slot, computed on the union of their
devices). ``Switches.distinct_kernels`` turns it on.
"""

from __future__ import annotations

import dataclasses
import hashlib
from collections.abc import Mapping
from typing import Any

import jax
import numpy as np

from tessel_jax import compat

from . import fsdp_tick as _fsdp_tick
from . import hoist as _hoist
from . import kernel_sends as _kernel_sends
from . import predicated as _predicated
from .lower_context import LowerContext
from .plan import Tick
from .tick_ctx import INPLACE


def merge(low: LowerContext, spec: Tick, pbuf: Mapping[Any, Any]) -> Tick:
  """``spec`` with each group of identical kernels in one branch (the
  group's lowest kernel id); ``spec`` itself where no two are identical."""
  rep = representatives(low, spec, pbuf)
  if all(rep[k] == k for k in rep):
    return spec
  branches = tuple(k for k in spec.branches if k is None or rep[k] == k)
  new_of_old = np.array([branches.index(k if k is None else rep[k])
                         for k in spec.branches], np.int64)
  return dataclasses.replace(spec, branches=branches,
                             branch_of=new_of_old[spec.branch_of])


def representatives(low: LowerContext, spec: Tick,
                    pbuf: Mapping[Any, Any]) -> dict[int, int]:
  """Kernel id -> the lowest id of the segment's kernels identical to it
  (itself where none is, or it cannot be merged)."""
  if INPLACE in pbuf or _fsdp_tick.per_block(low.layout):
    return {k: k for k in spec.branches if k is not None}
  hoisted = pbuf.get(_hoist.HOISTED, {})
  rounds = _rounds(low, spec)
  first: dict[tuple, int] = {}
  rep: dict[int, int] = {}
  for kid in sorted(k for k in spec.branches if k is not None):
    sig = signature(low, spec, kid, hoisted, rounds.get(kid, ()))
    rep[kid] = kid if sig is None else first.setdefault(sig, kid)
  return rep


def signature(low: LowerContext, spec: Tick, kid: int,
              hoisted: Mapping[int, Any], rounds: tuple = ()
              ) -> tuple | None:
  """What the lowering of kernel ``kid``'s loop body depends on, on the
  device running it (``rounds``: what it writes there, :func:`_rounds`);
  None where it reads a parameter other than from a slot (a leaf-specific
  read: never merged)."""
  kernel = low.plan.kernels[kid]
  places = _slot_places(low, kernel)
  if places is None:
    return None
  closed, tree = _hoist.abstract_trace(
      kernel, [low.local_avals[l] for l in kernel.params], kernel.in_avals)
  windows = tuple(repr(low.grad_windows.get(kernel.fwd, {}).get(l))
                  for l in kernel.grads)
  prepared = hoisted.get(kid)
  hoist = (None if prepared is None else
           (prepared.signature, tuple(id(v) for v in prepared.values)))
  grads = (tuple(kernel.params.index(l) for l in kernel.grads), windows,
           _predicated.owned_keys(low, kernel) if low.train else ())
  shape = (kernel.kind, kernel.mode, len(kernel.devices), kernel.split,
           kernel.in_split, kernel.out_split, kernel.summed)
  return (compat.plain_text(closed), _consts_digest(closed), str(tree),
          rounds, places, grads, shape, tuple(spec.in_map[kid]),
          tuple(spec.out_map[kid]), hoist)


def _rounds(low: LowerContext, spec: Tick) -> dict[int, tuple]:
  """Kernel id -> the rounds it writes in its loop and from which ports
  (``passes.kernel_sends``; none where the segment's messages are not
  written by the kernels' loops). Kernels writing other rounds (a remote
  send on one device, a local one on another: zbv's turn) stay apart, or
  the merged loop would write each one's rounds on the other's devices
  too (into sink slots, and outboxes would need sink slots again)."""
  sinks = [p.slots for p in low.plan.pools]
  if not _kernel_sends.writes_in_kernels(spec, sinks):
    return {}
  return {kid: tuple((ks.round, ks.outbox, ks.ports)
                     for ks in _kernel_sends.kernel_sends(spec, kid, b, sinks))
          for b, kid in enumerate(spec.branches) if kid is not None}


def _slot_places(low: LowerContext, kernel: Any) -> tuple | None:
  """``(class, slot)`` of each parameter, or None where one is not read
  from a slot alone (flat region, gathered, pipe-sharded, an FSDP class:
  its gathers are planned per kernel and device, ``fsdp_kernel``)."""
  layout = low.layout
  for dt in layout.dtypes:
    region = layout.regions[dt].get(kernel.fwd)
    if region is not None and region.leaves:
      return None
  places = []
  for l in kernel.params:
    where = layout.slot_of.get((l, kernel.devices[0]))
    if (where is None or low.reads_gathered(kernel, l)
        or l in layout.shards or layout.classes[where[0]].fsdp):
      return None
    places.append(tuple(where))
  return tuple(places)


def _consts_digest(closed: Any) -> tuple:
  """Shapes, dtypes and a digest of the values of ``closed``'s constants
  (equal text with different captured values is a different program); a
  typed PRNG key (a dropout kernel's captured key) by its key data."""
  out = []
  for c in compat.jaxpr_consts(closed)[1]:
    dtype = getattr(c, "dtype", None)
    if dtype is not None and jax.dtypes.issubdtype(dtype,
                                                   jax.dtypes.prng_key):
      # Called inside the lowering's trace: the key's data drawn eagerly.
      with jax.ensure_compile_time_eval():
        c = jax.random.key_data(c)
    a = np.asarray(c)
    out.append((a.shape, str(dtype if dtype is not None else a.dtype),
                hashlib.sha1(np.ascontiguousarray(a).tobytes()).hexdigest()))
  return tuple(out)


__all__ = ["merge", "representatives", "signature"]
