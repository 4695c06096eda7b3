"""Few-row dots against a weight, with the weight read in place.

XLA:CPU's YNNPACK dot packs its right operand at every call. For
``x @ W`` with ``x`` of a few rows (a block split by rows over several
devices: ``mshape(4)``'s shared block runs 64 of 256 rows on each device)
and ``W`` a large weight, the backward's ``dy @ W.T`` repacks the whole
weight (a 4 MB transpose for 1024 x 1024 floats) for a dot of 64 rows:
per row four times what a 256-row dot pays, and from memory, not cache,
when the tick's other weights have run in between.

:func:`rewrite` re-traces a block's top-level ``x @ W`` equations
(``x``: ``rows <= max_rows``; ``W``: a parameter input of at least
``min_side`` per side) through :func:`row_dot`, whose backward computes the
input cotangent as ``(W @ dy.T).T``: ``W`` is then the left operand, read
in place, and only the few-row ``dy.T`` is packed. The transposes sit
behind ``lax.optimization_barrier`` so that XLA's simplifier does not fold
them back into ``dy @ W.T``. The forward and the weight gradient are the
usual dots. The same products summed over the same axis, operands swapped
(peer_bench's mshape(4): grad rel err against ``jax.value_and_grad``
5.75e-7 with and without). ``forward=True`` (``Switches.row_dots_forward``,
off) also takes the forward as ``(W.T @ x.T).T`` (:func:`row_dot_t`; ``W.T``
is parameter-only, so ``passes.hoist`` computes it once per step).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import jax
from jax import lax

from tessel_jax import compat

from . import block_rebind

_DOT = "dot_general"
_PLAIN = (((1,), (0,)), ((), ()))


@jax.custom_vjp
def row_dot(x: Any, w: Any) -> Any:
  """``x @ w`` whose input cotangent reads ``w`` as the left operand."""
  return x @ w


def _row_dot_fwd(x: Any, w: Any) -> tuple[Any, tuple[Any, Any]]:
  return x @ w, (x, w)


def _row_dot_bwd(res: tuple[Any, Any], g: Any) -> tuple[Any, Any]:
  x, w = res
  gt = lax.optimization_barrier(g.T)
  dx = lax.optimization_barrier(w @ gt).T
  dw = lax.dot_general(x, g, (((0,), (0,)), ((), ())))
  return dx.astype(x.dtype), dw.astype(w.dtype)


row_dot.defvjp(_row_dot_fwd, _row_dot_bwd)


@jax.custom_vjp
def row_dot_t(x: Any, w: Any, wt: Any) -> Any:
  """:func:`row_dot` whose forward reads ``wt`` (``w.T``, parameter-only:
  ``passes.hoist`` computes it once per step) as the left operand too."""
  return _forward_t(x, wt)


def _forward_t(x: Any, wt: Any) -> Any:
  xt = lax.optimization_barrier(x.T)
  return lax.optimization_barrier(wt @ xt).T


def _row_dot_t_fwd(x: Any, w: Any, wt: Any) -> tuple[Any, tuple[Any, Any]]:
  return _forward_t(x, wt), (x, w)


def _row_dot_t_bwd(res: tuple[Any, Any], g: Any) -> tuple[Any, Any, None]:
  return _row_dot_bwd(res, g) + (None,)


row_dot_t.defvjp(_row_dot_t_fwd, _row_dot_t_bwd)


def _bind(ins: Sequence[Any], forward: bool) -> list[Any]:
  x, w = ins
  if not forward:
    return [row_dot(x, w)]
  return [row_dot_t(x, w, lax.stop_gradient(w).T)]


def matches(eqn: Any, weights: frozenset, max_rows: int,
            min_side: int) -> bool:
  """Whether ``eqn`` is ``x @ W`` with ``x`` of at most ``max_rows`` rows
  and ``W`` (a variable in ``weights``) at least ``min_side`` per side, one
  dtype throughout, at the default precision (a dot the user gave a
  ``precision`` is left as written: the rewritten dots would not carry
  it)."""
  if compat.primitive_name(eqn) != _DOT or len(eqn.invars) != 2:
    return False
  p = compat.eqn_params(eqn)
  dims = tuple(tuple(tuple(d) for d in part)
               for part in p["dimension_numbers"])
  x, w = eqn.invars
  if dims != _PLAIN or compat.is_literal(w) or w not in weights:
    return False
  xs, ws = x.aval.shape, w.aval.shape
  dtypes = {x.aval.dtype, w.aval.dtype, eqn.outvars[0].aval.dtype}
  pref = p.get("preferred_element_type")
  return (len(xs) == 2 and len(ws) == 2 and xs[0] <= max_rows
          and min(ws) >= min_side and len(dtypes) == 1
          and (pref is None or pref == x.aval.dtype)
          and p.get("precision") is None)


def rewrite(block: Any, max_rows: int = 64, min_side: int = 256,
            forward: bool = False) -> Any:
  """``block`` (a ``passes.partition.ForwardBlock``) with its few-row dots
  against parameter inputs bound through :func:`row_dot` (``forward``:
  :func:`row_dot_t`); the same object where it has none."""
  weights = frozenset(block.invars[i] for i in block.param_inputs)
  hits = {i for i, e in enumerate(block.eqns)
          if matches(e, weights, max_rows, min_side)}
  return block_rebind.rebind(block, hits,
                             lambda eqn, ins: _bind(ins, forward))


def count(blocks: Sequence[Any], max_rows: int = 64,
          min_side: int = 256) -> int:
  """How many equations :func:`rewrite` would rebind in ``blocks``."""
  total = 0
  for b in blocks:
    weights = frozenset(b.invars[i] for i in b.param_inputs)
    total += sum(matches(e, weights, max_rows, min_side) for e in b.eqns)
  return total


__all__ = ["count", "matches", "rewrite", "row_dot", "row_dot_t"]
