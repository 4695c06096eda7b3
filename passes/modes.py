"""How each block on several devices shares a micro-batch: split or replicated.

A block on ``g > 1`` devices runs in one of two modes:

* ``split``: each device takes ``b / g`` of the micro-batch's rows (the
  function re-traced at ``b / g`` rows); only when the block's work is
  independent across rows (``passes.rows``), ``b`` divides by ``g``, every
  batch-carrying value it reads or exports has the batch on axis 0, every
  differentiable activation it reads carries the batch (its cotangent then
  needs no sum over devices) and the re-trace has the same structure;
* ``replicated``: every device computes all ``b`` rows (the full trace, so
  random draws give the plain function's bits); one device (the block's
  first, the *leader*) counts its terminals and parameter gradients.

A block on one device is ``single``. Modes are chosen in block order: the
batch axes a block exports feed the analysis of the blocks reading them.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

import jax.numpy as jnp

from . import rows as _rows
from .partition import ForwardBlock, Partition

MODES = ("single", "split", "replicated")


@dataclasses.dataclass(frozen=True)
class BlockMode:
  """How forward block ``index`` runs on its devices.

  Attributes:
    index: Forward block index.
    mode: ``"single"``, ``"split"`` or ``"replicated"``.
    devices: Devices of the block.
    reason: Why a shared block is replicated (empty otherwise).
  """

  index: int
  mode: str
  devices: tuple[int, ...]
  reason: str = ""

  def describe(self) -> str:
    """``"split 4-way"``, ``"replicated: <reason>"`` or ``"one device"``."""
    if self.mode == "split":
      return f"split {len(self.devices)}-way"
    if self.mode == "replicated":
      return f"replicated: {self.reason}"
    return "one device"


def choose_modes(part: Partition, devices: Mapping[int, Sequence[int]],
                 rows: int, local_parts: Mapping[int, Partition] | None,
                 differentiable: Mapping[int, bool]) -> dict[int, BlockMode]:
  """Picks every forward block's mode.

  Args:
    part: The partition (traced at ``rows`` rows per micro-batch).
    devices: Forward index -> devices of its ``F`` block.
    rows: Micro-batch rows ``b``.
    local_parts: ``g`` -> the partition traced at ``b / g`` rows.
    differentiable: Forward index -> its activations get cotangents.

  Returns:
    Forward index -> :class:`BlockMode`.
  """
  axes: dict[tuple[int, int], _rows.Axis] = {}
  origin: dict[int, tuple[int, str]] = {}  # block -> where its rows mixed
  out: dict[int, BlockMode] = {}
  for fb in part.blocks:
    devs = tuple(devices[fb.index])
    in_axes = [_input_axis(s, axes) for s in fb.inputs]
    found = _rows.analyze_eqns(
        fb.eqns, tuple(fb.invars) + tuple(fb.const_vars), fb.outvars,
        in_axes + [None] * len(fb.const_vars), rows)
    for k, a in enumerate(found.out_axes):
      axes[(fb.index, k)] = a
    source = _mixed_source(fb, in_axes, origin)
    if source is not None:
      origin[fb.index] = origin[source[0]]
      j, k = source
      first, what = origin[j]
      reason = (f"it reads output {k} of block {j}, whose rows were mixed in"
                f" block {first} ({what})")
    else:
      origin[fb.index] = (fb.index, found.reason)
      reason = found.reason
    if len(devs) == 1:
      out[fb.index] = BlockMode(fb.index, "single", devs)
      continue
    reason = (reason if found.coupled else
              _split_obstacle(fb, in_axes, found.out_axes, rows, len(devs),
                              local_parts, differentiable))
    out[fb.index] = BlockMode(fb.index, "replicated" if reason else "split",
                              devs, reason)
  return out


def _mixed_source(fb: ForwardBlock, in_axes: Sequence[_rows.Axis],
                  origin: Mapping[int, tuple[int, str]]
                  ) -> tuple[int, int] | None:
  """``(block, output)`` of the first input that arrives with its rows
  already mixed, or None."""
  for s, a in zip(fb.inputs, in_axes):
    if a == _rows.MIXED and s.index in origin:
      return s.index, s.output
  return None


def _input_axis(src: Any, axes: Mapping[tuple[int, int], _rows.Axis]
                ) -> _rows.Axis:
  if src.kind == "batch":
    return 0
  if src.kind == "act":
    return axes[(src.index, src.output)]
  return None


def _split_obstacle(fb: ForwardBlock, in_axes: Sequence[_rows.Axis],
                    out_axes: Sequence[_rows.Axis], rows: int, g: int,
                    local_parts: Mapping[int, Partition] | None,
                    differentiable: Mapping[int, bool]) -> str:
  """Why a row-independent block cannot split its rows ('' when it can)."""
  if rows % g:
    return f"{rows} rows do not divide over {g} devices"
  for what, axs in (("reads", in_axes), ("exports", out_axes)):
    for a in axs:
      if a is not None and a != 0:
        return (f"it {what} a value carrying the batch on axis {a}, not"
                f" axis 0")
  for s, a, aval in zip(fb.inputs, in_axes, fb.in_avals):
    if (s.kind == "act" and a is None and differentiable.get(s.index, False)
        and jnp.issubdtype(aval.dtype, jnp.inexact)):
      return (f"it reads a differentiable value of block {s.index} without"
              f" the batch axis (its gradient would need a sum over the"
              f" devices)")
  local = local_block(fb, (local_parts or {}).get(g), g, rows, in_axes,
                      out_axes)
  if local is None:
    return (f"the function traced at {rows // g} rows reads or exports"
            f" other values in this block")
  return ""


def local_block(fb: ForwardBlock, local: Partition | None, g: int, rows: int,
                in_axes: Sequence[_rows.Axis],
                out_axes: Sequence[_rows.Axis]) -> ForwardBlock | None:
  """Block ``fb.index`` of the ``b / g``-row trace, when it matches ``fb``
  (same inputs and outputs, rows only cut along the batch axes)."""
  if local is None or len(local.blocks) <= fb.index:
    return None
  lb = local.blocks[fb.index]
  if lb.inputs != fb.inputs or len(lb.outvars) != len(fb.outvars):
    return None
  pairs = list(zip(fb.in_avals, lb.in_avals, in_axes)) + list(
      zip(fb.out_avals, lb.out_avals, out_axes))
  for full, loc, a in pairs:
    want = tuple(full.shape)
    if a == 0:
      want = (rows // g,) + want[1:]
    if tuple(loc.shape) != want or loc.dtype != full.dtype:
      return None
  return lb
