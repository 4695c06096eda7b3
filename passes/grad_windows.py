"""Parameter gradients added only where they can be nonzero.

A block that reads a parameter only through static, stride-1 ``slice``\\ s
(a dead-tap convolution's live taps, ``passes.dead_taps``: 1 of 9 taps of
ResNet18's stage-4 kernels on 1x1 maps) has a gradient that is zero outside
the slices' bounding box: the transpose of a slice pads with zeros. Added
whole, every backward kernel reads and writes the full accumulator
(``pad_add_fusion`` of ``f32[3,3,512,512]`` per weight and micro-batch in
the placed ResNet18 program). :func:`window` finds the box from the
block's equations, and :func:`add` adds only the box,
``dynamic_update_slice(acc, slice(acc) + slice(g))``, which XLA runs in
place on the accumulator and simplifies ``slice(pad(x))`` to ``x``.
Exact: outside the box the gradient is zero.

Pure jaxpr inspection plus two ``lax`` calls; no jax internals.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from jax import lax

from tessel_jax import compat

Window = tuple[tuple[int, ...], tuple[int, ...]]


def window(eqns: Sequence[Any], outvars: Sequence[Any], var: Any
           ) -> Window | None:
  """``(start, limit)`` of ``var``'s elements the equations read.

  Returns the bounding box of every read when each one is a ``slice``
  with unit strides (a slice read only by slices in turn counts as the
  box of those: ``passes.dead_taps`` slices one spatial dimension at a
  time) and the box is smaller than ``var``; None when ``var`` is read
  otherwise (any other equation, including a call that takes it whole),
  is an output, or is read whole (or not at all).

  Args:
    eqns: The equations of the block (top level).
    outvars: Its outputs.
    var: One of its input variables.
  """
  box = _read_box(eqns, outvars, var)
  shape = tuple(var.aval.shape)
  if box is None or box == ((0,) * len(shape), shape):
    return None
  return box


def _read_box(eqns: Sequence[Any], outvars: Sequence[Any], var: Any
              ) -> Window | None:
  """The box of ``var`` that slices read (None: read otherwise or not
  at all)."""
  if any(v is var for v in outvars):
    return None
  shape = tuple(var.aval.shape)
  lo, hi = list(shape), [0] * len(shape)
  seen = False
  for i, eqn in enumerate(eqns):
    if not any(v is var for v in eqn.invars):
      continue
    if compat.primitive_name(eqn) != "slice":
      return None
    p = compat.eqn_params(eqn)
    if p.get("strides") not in (None, (1,) * len(shape)):
      return None
    start = [int(b) for b in p["start_indices"]]
    limit = [int(b) for b in p["limit_indices"]]
    inner = _read_box(eqns[i + 1:], outvars, eqn.outvars[0])
    if inner is not None:  # a slice of the slice: narrow to its box
      limit = [s + b for s, b in zip(start, inner[1])]
      start = [s + a for s, a in zip(start, inner[0])]
    seen = True
    lo = [min(a, b) for a, b in zip(lo, start)]
    hi = [max(a, b) for a, b in zip(hi, limit)]
  return (tuple(lo), tuple(hi)) if seen else None


def block_windows(block: Any) -> dict[int, Window]:
  """Parameter leaf -> its gradient's window, for a
  ``passes.partition.ForwardBlock`` (leaves read whole are left out)."""
  out = {}
  for v, src in zip(block.invars, block.inputs):
    if src.kind != "param":
      continue
    w = window(block.eqns, block.outvars, v)
    if w is not None:
      out[src.index] = w
  return out


def add(acc: Any, g: Any, win: Window | None) -> Any:
  """``acc + g``, touching only ``win`` of ``acc`` (None: all of it)."""
  if win is None or tuple(acc.shape) != tuple(g.shape):
    return acc + g
  start, limit = win
  cur = lax.slice(acc, start, limit) + lax.slice(g, start, limit)
  return lax.dynamic_update_slice(acc, cur, start)


__all__ = ["Window", "add", "block_windows", "window"]
