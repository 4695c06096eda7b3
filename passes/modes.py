"""How each block on several devices shares a micro-batch: split or replicated.

A block on ``g > 1`` devices runs in one of two modes:

* ``split``: each device takes ``b / g`` of the micro-batch's rows (the
  function re-traced at ``b / g`` rows); only when the block's work is
  independent across rows (``passes.rows``), ``b`` divides by ``g``, every
  batch-carrying value it reads or exports has the batch on axis 0, every
  differentiable activation it reads carries the batch (its cotangent then
  needs no sum over devices) and the re-trace has the same structure;
  A terminal output that is a linear function of a sum over the rows (a
  mean loss, ``passes.rows.SUMMED``) stays split when only the epilogue
  reads it: every device's partial value counts, scaled by ``r`` (``1 / g``
  for a mean, 1 for a sum; probed once by :func:`sum_ratios`);
* ``replicated``: every device computes all ``b`` rows (the full trace, so
  random draws give the plain function's bits); one device (the block's
  first, the *leader*) counts its terminals and parameter gradients.

A block on one device is ``single``. Modes are chosen in block order: the
batch axes a block exports feed the analysis of the blocks reading them.
"""

from __future__ import annotations

import dataclasses
import hashlib
from collections.abc import Mapping, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from tessel_jax import compat

from . import probe_eval as _probe_eval
from . import row_scaling as _scaling
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
    summed: Split blocks: ``(output, r)`` of terminal outputs that are sums
      over the rows (a mean loss): the output is ``r`` times the sum of the
      devices' values (``r = 1 / g`` for a mean, 1 for a sum).
  """

  index: int
  mode: str
  devices: tuple[int, ...]
  reason: str = ""
  summed: tuple[tuple[int, float], ...] = ()

  def describe(self) -> str:
    """``"split 4-way"``, ``"replicated: <reason>"`` or ``"one device"``."""
    if self.mode == "split":
      extra = " (partial sums: " + ", ".join(
          f"output {k}" for k, _ in self.summed) + ")" if self.summed else ""
      return f"split {len(self.devices)}-way{extra}"
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
  read = {(s.index, s.output) for fb in part.blocks for s in fb.inputs
          if s.kind == "act"}
  terminal = {(t.index, t.output) for t in part.epilogue.terminals}
  out: dict[int, BlockMode] = {}
  for fb in part.blocks:
    devs = tuple(devices[fb.index])
    in_axes = [_input_axis(s, axes) for s in fb.inputs]
    found = _analyze(fb, in_axes, rows)
    if len(devs) > 1 and not rows % len(devs):
      promoted = _scaling.promoted_axes(
          fb, _local(local_parts, fb.index, len(devs)), in_axes, rows,
          len(devs))
      alt = _analyze(fb, promoted, rows) if promoted else None
      if alt is not None and not alt.coupled:
        in_axes, found = promoted, alt
    summed = [k for k, a in enumerate(found.out_axes) if a == _rows.SUMMED]
    for k, a in enumerate(found.out_axes):
      axes[(fb.index, k)] = _rows.MIXED if a == _rows.SUMMED else a
    reason = _origin(fb, in_axes, found, origin)
    if len(devs) == 1:
      out[fb.index] = BlockMode(fb.index, "single", devs)
      continue
    g = len(devs)
    if not found.coupled:
      reason = _split_obstacle(fb, in_axes, found.out_axes, rows, g,
                               local_parts, differentiable)
    ratios: tuple[tuple[int, float], ...] = ()
    if not reason and summed:
      reason = _summed_obstacle(fb.index, summed, read, terminal)
      if not reason:
        ratios = sum_ratios(fb, local_parts[g].blocks[fb.index], in_axes,
                            summed, rows, g)
        if not ratios:
          reason = (f"reduce_sum over the batch axis (output {summed[0]}:"
                    f" the devices' partial sums do not add up to it)")
    out[fb.index] = BlockMode(fb.index, "replicated" if reason else "split",
                              devs, reason, () if reason else ratios)
  return out


def _analyze(fb: ForwardBlock, in_axes: Sequence[_rows.Axis],
             rows: int) -> _rows.RowCoupling:
  return _rows.analyze_eqns(
      fb.eqns, tuple(fb.invars) + tuple(fb.const_vars), fb.outvars,
      list(in_axes) + [None] * len(fb.const_vars), rows)


def _local(local_parts: Mapping[int, Partition] | None, i: int,
           g: int) -> ForwardBlock | None:
  local = (local_parts or {}).get(g)
  return local.blocks[i] if local is not None and len(local.blocks) > i \
      else None


def _origin(fb: ForwardBlock, in_axes: Sequence[_rows.Axis],
            found: _rows.RowCoupling, origin: dict[int, tuple[int, str]]
            ) -> str:
  """Records where ``fb``'s rows first mixed; returns why it is coupled."""
  source = _mixed_source(fb, in_axes, origin)
  if source is not None:
    origin[fb.index] = origin[source[0]]
    j, k = source
    first, what = origin[j]
    return (f"it reads output {k} of block {j}, whose rows were mixed in"
            f" block {first} ({what})")
  what = found.reason or ("reduce_sum over the batch axis" if
                          _rows.SUMMED in found.out_axes else "")
  origin[fb.index] = (fb.index, what)
  return found.reason


def _summed_obstacle(i: int, summed: Sequence[int], read: set[tuple[int, int]],
                     terminal: set[tuple[int, int]]) -> str:
  """Why a sum over the rows cannot stay split: another block reads it or
  it is no terminal ('' when every one only feeds the epilogue)."""
  for k in summed:
    if (i, k) in read or (i, k) not in terminal:
      return (f"reduce_sum over the batch axis (output {k} feeds another"
              f" block, which would need the devices' sum)")
  return ""


# sum_ratios results by block content: every plan priced by placement="auto"
# cuts the same program, and the probe compiles the whole block.
_RATIOS: dict[tuple[Any, ...], tuple[tuple[int, float], ...]] = {}


def _block_key(fb: ForwardBlock) -> tuple[str, str]:
  """Text and constant bytes of ``fb`` (equal keys: equal block)."""
  text = compat.jaxpr_text(fb.eqns, tuple(fb.invars) + tuple(fb.const_vars),
                           fb.outvars)
  h = hashlib.sha256()
  for v in fb.const_vals:
    a = np.asarray(v)
    h.update(f"{a.dtype}{a.shape}".encode())
    h.update(a.tobytes())
  return text, h.hexdigest()


def sum_ratios(full: ForwardBlock, local: ForwardBlock,
               in_axes: Sequence[_rows.Axis], summed: Sequence[int],
               rows: int, g: int) -> tuple[tuple[int, float], ...]:
  """Per summed output: ``r`` with ``full = r * (sum of the devices' local
  values)``, ``1 / g`` (a mean) or ``1`` (a sum); ``()`` when it is neither.

  Probed once on inputs whose batch rows are all equal (then every device's
  local value is the same ``P`` and ``full = r * g * P``); the analysis
  already showed the output linear in the sum over rows. Remembered per
  process by the blocks' content.
  """
  try:
    key = (_block_key(full), _block_key(local), tuple(in_axes),
           tuple(summed), rows, g)
    hash(key)
  except Exception:  # pylint: disable=broad-except  (unprintable block)
    return _probe_ratios(full, local, in_axes, summed, rows, g)
  if key not in _RATIOS:
    _RATIOS[key] = _probe_ratios(full, local, in_axes, summed, rows, g)
  return _RATIOS[key]


def _probe_ratios(full: ForwardBlock, local: ForwardBlock,
                  in_axes: Sequence[_rows.Axis], summed: Sequence[int],
                  rows: int, g: int) -> tuple[tuple[int, float], ...]:
  """:func:`sum_ratios` without the memo.

  Both blocks are compiled once and evaluated on example values of each
  kind of :data:`_EXAMPLES` in turn until the outputs are finite: on one
  of the autocut's cuts of the README GPT the loss block (its equations
  include ``log`` and ``rsqrt``) gave NaN on signed values, and was
  replicated for it (session 48)."""
  if any(jax.dtypes.issubdtype(a.dtype, jax.dtypes.prng_key)
         for a in full.in_avals):
    return ()
  runs = []
  for block in (full, local):
    shapes = [jax.ShapeDtypeStruct(a.shape, a.dtype) for a in block.in_avals]
    try:
      runs.append(_probe_eval.compiled(
          lambda *a, b=block: [b(*a)[k] for k in summed], shapes))
    except Exception:  # pylint: disable=broad-except
      return ()
  for kind in _EXAMPLES:
    full_in, local_in = _probe_inputs(full, local, in_axes, rows, g, kind)
    try:
      f_out, l_out = runs[0](*full_in), runs[1](*local_in)
    except Exception:  # pylint: disable=broad-except
      return ()
    pairs = [(np.asarray(f, np.float64), np.asarray(p, np.float64))
             for f, p in zip(f_out, l_out)]
    if not all(np.all(np.isfinite(f)) and np.all(np.isfinite(p))
               for f, p in pairs):
      continue
    ratios = [_ratio(f, g * p, g) for f, p in pairs]
    if any(r is None for r in ratios):
      return ()
    return tuple(zip(summed, ratios))
  return ()


#: Kinds of example float values the probe tries, in order: signed
#: (normal, scale 0.5, shifted by 0.1), then positive (uniform on 0.5-1.5).
_EXAMPLES = ("signed", "positive")


def _probe_inputs(full: ForwardBlock, local: ForwardBlock,
                  in_axes: Sequence[_rows.Axis], rows: int, g: int,
                  kind: str) -> tuple[list[np.ndarray], list[np.ndarray]]:
  """Example inputs of ``full`` and ``local`` whose batch rows are all
  equal (float values of ``kind``)."""
  rng = np.random.default_rng(0)
  full_in, local_in = [], []
  for aval, lav, a in zip(full.in_avals, local.in_avals, in_axes):
    row = _example(tuple(lav.shape[1:]) if a == 0 else tuple(aval.shape),
                   aval.dtype, rng, kind)
    if a == 0:
      full_in.append(np.repeat(row[None], rows, axis=0))
      local_in.append(np.repeat(row[None], rows // g, axis=0))
    else:
      full_in.append(row)
      local_in.append(row)
  return full_in, local_in


def _ratio(f: np.ndarray, gp: np.ndarray, g: int) -> float | None:
  """``f / gp`` when it is one constant, ``1 / g`` or ``1``, else None."""
  if not (np.all(np.isfinite(f)) and np.all(np.isfinite(gp))):
    return None
  scale = float(np.max(np.abs(gp), initial=0.0))
  big = np.abs(gp) > 1e-6 * scale
  if scale == 0.0 or np.any((np.abs(f) > 1e-6 * scale) & ~big):
    return None
  r = f[big] / gp[big]
  for want in (1.0 / g, 1.0):
    if np.allclose(r, want, rtol=1e-4, atol=0.0):
      return want
  return None


def _example(shape: tuple[int, ...], dtype: Any, rng: np.random.Generator,
             kind: str = "signed") -> np.ndarray:
  if jnp.issubdtype(dtype, jnp.inexact):
    if kind == "positive":
      return rng.uniform(0.5, 1.5, shape).astype(dtype)
    return (rng.standard_normal(shape) * 0.5 + 0.1).astype(dtype)
  if jnp.issubdtype(dtype, jnp.bool_):
    return np.ones(shape, bool)
  return np.zeros(shape, dtype)


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
      if a is not None and a not in (0, _rows.SUMMED):
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
  return _scaling.row_uniform_problem(
      fb, local, in_axes,
      _scaling.scaled_outputs(fb, local, out_axes, rows, g), rows, g)


def local_block(fb: ForwardBlock, local: Partition | None, g: int, rows: int,
                in_axes: Sequence[_rows.Axis],
                out_axes: Sequence[_rows.Axis]) -> ForwardBlock | None:
  """Block ``fb.index`` of the ``b / g``-row trace, when it matches ``fb``
  (same inputs and outputs, rows only cut along the batch axes and along
  axis 0 of batch-sized outputs that do not carry the batch, which
  ``_split_obstacle`` checks with ``row_scaling.row_uniform_problem``)."""
  if local is None or len(local.blocks) <= fb.index:
    return None
  lb = local.blocks[fb.index]
  if lb.inputs != fb.inputs or len(lb.outvars) != len(fb.outvars):
    return None
  pairs = list(zip(fb.in_avals, lb.in_avals, in_axes)) + list(
      zip(fb.out_avals, lb.out_avals, out_axes))
  scaled = set(_scaling.scaled_outputs(fb, lb, out_axes, rows, g))
  for j, (full, loc, a) in enumerate(pairs):
    want = tuple(full.shape)
    if a == 0 or j - len(fb.in_avals) in scaled:
      want = (rows // g,) + want[1:]
    if tuple(loc.shape) != want or loc.dtype != full.dtype:
      return None
  return lb
