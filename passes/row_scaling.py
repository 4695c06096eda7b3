"""Batch-sized values that do not carry the batch, in a row-split block.

Model code often builds arrays whose first axis has the micro-batch's size
without reading the batch: Hugging Face's GPT-2 makes its attention mask
with ``jnp.ones((batch, seq))`` and its position ids with ``broadcast_to``.
The row analysis (``passes.rows``) rightly calls such a value independent of
the batch (axis ``None``), yet the function re-traced at ``b / g`` rows makes
it ``b / g`` rows long. A block splitting its rows over ``g`` devices can
still run exactly:

* an *input* of this kind is sliced like a batch value (each device reads
  its rows of it): :func:`promoted_axes` marks it as carrying the batch on
  axis 0, and the block may split only if the row analysis with that axis
  still finds every output row depending on the same input row alone;
* an *output* of this kind is assembled from the devices' values like a
  batch value, which equals ``fn``'s value only when every row slice of it
  is what the re-trace computes (a mask of ones is; ``w[:batch]`` is not):
  :func:`row_uniform_problem` checks that on random inputs, once.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from tessel_jax import compat

from .partition import ForwardBlock

Axis = int | None


def _scaled(full: Any, local: Any, rows: int, g: int) -> bool:
  """``full`` has ``rows`` rows and ``local`` is it at ``rows / g`` rows."""
  fs, ls = tuple(full.shape), tuple(local.shape)
  return (bool(fs) and fs[0] == rows and ls == (rows // g,) + fs[1:] and
          local.dtype == full.dtype)


def promoted_axes(fb: ForwardBlock, lb: ForwardBlock | None,
                  in_axes: Sequence[Axis], rows: int,
                  g: int) -> list[Axis] | None:
  """``in_axes`` with batch-sized, batch-independent activations read by
  ``fb`` marked as axis 0 (None: there are none, or ``lb`` does not read
  the same inputs as ``fb``)."""
  if lb is None or lb.inputs != fb.inputs:
    return None
  out, changed = list(in_axes), False
  for p, (s, fa, la) in enumerate(zip(fb.inputs, fb.in_avals, lb.in_avals)):
    if s.kind == "act" and out[p] is None and _scaled(fa, la, rows, g):
      out[p], changed = 0, True
  return out if changed else None


def scaled_outputs(fb: ForwardBlock, lb: ForwardBlock,
                   out_axes: Sequence[Axis], rows: int,
                   g: int) -> tuple[int, ...]:
  """Outputs independent of the batch that the re-trace makes ``b / g``
  rows long."""
  return tuple(k for k, (a, fa, la) in enumerate(
      zip(out_axes, fb.out_avals, lb.out_avals))
               if a is None and _scaled(fa, la, rows, g))


def row_uniform_problem(fb: ForwardBlock, lb: ForwardBlock,
                        in_axes: Sequence[Axis], outputs: Sequence[int],
                        rows: int, g: int) -> str:
  """Why the devices' values of ``outputs`` would not assemble into ``fb``'s
  ('' when each device's value equals its rows of the full value).

  Evaluates only the equations the outputs need, on random inputs: the
  full block on all rows, the re-trace once per device on its rows of the
  inputs that carry the batch.
  """
  if not outputs:
    return ""
  rng = np.random.default_rng(0)
  values = [_random(a, rng) for a in fb.in_avals]
  step = rows // g
  for k in outputs:
    want = np.asarray(_eval_one(fb, k, values))
    for d in range(g):
      lo, hi = d * step, (d + 1) * step
      mine = [v[lo:hi] if a == 0 else v for v, a in zip(values, in_axes)]
      got = np.asarray(_eval_one(lb, k, mine))
      if got.shape != want[lo:hi].shape or not np.array_equal(
          got, want[lo:hi], equal_nan=True):
        return (f"its output {k} of shape {tuple(want.shape)} has the batch's"
                f" size without depending on the batch, and the function"
                f" traced at {step} rows does not compute its rows (e.g. a"
                f" slice of a parameter by the batch size)")
  return ""


def _eval_one(fb: ForwardBlock, k: int, values: Sequence[Any]) -> Any:
  """Output ``k`` of ``fb`` from only the equations it needs."""
  target = fb.outvars[k]
  eqns = _needed(fb.eqns, target)
  env = dict(zip(fb.invars, values))
  env.update(zip(fb.const_vars, fb.const_vals))
  reads = [v for e in eqns for v in e.invars if not compat.is_literal(v)]
  reads += [] if compat.is_literal(target) else [target]
  inner = [v for v in dict.fromkeys(reads) if v in env]
  return compat.eval_eqns(eqns, inner, [target], [env[v] for v in inner])[0]


def _needed(eqns: Sequence[Any], target: Any) -> list[Any]:
  live = set() if compat.is_literal(target) else {target}
  keep = []
  for eqn in reversed(eqns):
    if any(v in live for v in eqn.outvars if not compat.is_dropvar(v)):
      keep.append(eqn)
      live.update(v for v in eqn.invars if not compat.is_literal(v))
  return keep[::-1]


def _random(aval: Any, rng: np.random.Generator) -> Any:
  dt = aval.dtype
  if jax.dtypes.issubdtype(dt, jax.dtypes.prng_key):
    n = int(np.prod(aval.shape, dtype=np.int64))
    keys = jax.random.split(jax.random.key(0), max(n, 1))[:n]
    return keys.reshape(aval.shape)
  if jnp.issubdtype(dt, jnp.inexact):
    return jnp.asarray(rng.standard_normal(aval.shape), dt)
  if jnp.issubdtype(dt, jnp.bool_):
    return jnp.asarray(rng.integers(0, 2, aval.shape).astype(bool))
  return jnp.asarray(rng.integers(0, 2, aval.shape), dt)
