"""Work of jaxpr equations: floating-point operations and bytes moved.

Counted per equation, nested jaxprs inside (``flops``: 2 x multiply-adds
for ``dot_general`` and convolutions, one per output element for
elementwise ops, one per input element for reductions,
:data:`TRANSCENDENTAL_FLOPS` per element of a transcendental; a scan's body
times its length; ``bytes``: operands + results, views free). The automatic
cut's roofline (``passes.autocut_cost``) and the kernel flop counts of
``tessel_jax.cost.flops`` read it; it imports nothing of either.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import numpy as np

from tessel_jax import compat

# Views and markers: no data is moved once XLA has compiled the block.
_FREE = frozenset({
    "reshape", "squeeze", "expand_dims", "stop_gradient", "tessel_boundary",
    "copy_p", "pvary", "pcast", "optimization_barrier", "bitcast_convert_type",
    "broadcast_in_dim", "iota",
})
_REDUCTIONS = frozenset({
    "reduce_sum", "reduce_max", "reduce_min", "reduce_prod", "reduce_and",
    "reduce_or", "reduce_xor", "argmax", "argmin", "cumsum", "cumprod",
    "cummax", "cummin", "cumlogsumexp", "reduce_precision",
})
_TRANSCENDENTAL = frozenset({
    "exp", "exp2", "log", "log1p", "expm1", "tanh", "logistic", "erf",
    "erfc", "erf_inv", "sin", "cos", "tan", "atan2", "asin", "acos", "atan",
    "sinh", "cosh", "asinh", "acosh", "atanh", "pow", "rsqrt", "sqrt", "cbrt",
    "lgamma", "digamma",
})
TRANSCENDENTAL_FLOPS = 4  # flops charged per element of a transcendental op

@dataclasses.dataclass(frozen=True)
class EqnCost:
  """Work of one equation.

  Attributes:
    flops: Floating-point (or integer) operations.
    bytes: Bytes read and written (0 for views).
    contraction_flops: The part of ``flops`` in dot_general/convolutions.
  """

  flops: float
  bytes: float
  contraction_flops: float = 0.0

  def __add__(self, other: "EqnCost") -> "EqnCost":
    return EqnCost(self.flops + other.flops, self.bytes + other.bytes,
                   self.contraction_flops + other.contraction_flops)

  def scaled(self, k: float) -> "EqnCost":
    return EqnCost(self.flops * k, self.bytes * k, self.contraction_flops * k)


ZERO = EqnCost(0.0, 0.0)


def _size(aval: Any) -> int:
  shape = getattr(aval, "shape", ())
  return int(np.prod(shape, dtype=np.int64)) if shape else 1


def nbytes(aval: Any) -> int:
  """Bytes of an abstract value (0 for tokens and other non-arrays)."""
  dtype = getattr(aval, "dtype", None)
  if dtype is None:
    return 0
  try:
    itemsize = np.dtype(dtype).itemsize
  except TypeError:  # extended dtypes (PRNG keys): count their storage
    itemsize = 8
  return _size(aval) * itemsize


def _atoms_bytes(atoms: Sequence[Any]) -> int:
  return sum(nbytes(a.aval) for a in atoms
             if not compat.is_literal(a) and not compat.is_dropvar(a))


def _jaxpr_cost(jaxpr: Any) -> EqnCost:
  total = ZERO
  for eqn in jaxpr.eqns:
    total = total + eqn_cost(eqn)
  return total


def eqn_cost(eqn: Any) -> EqnCost:
  """Roofline work of one equation (nested jaxprs included)."""
  name = compat.primitive_name(eqn)
  params = compat.eqn_params(eqn)
  subs = compat.sub_jaxprs(eqn)
  if subs:
    if name == "scan":
      return _jaxpr_cost(subs[0]).scaled(float(params.get("length", 1)))
    if name == "cond":
      costs = [_jaxpr_cost(s) for s in subs]
      return max(costs, key=lambda c: (c.flops, c.bytes))
    total = ZERO
    for s in subs:
      total = total + _jaxpr_cost(s)
    return total
  if name in _FREE:
    return ZERO
  outs = [v for v in eqn.outvars if not compat.is_dropvar(v)]
  moved = float(_atoms_bytes(eqn.invars) + _atoms_bytes(outs))
  out_elems = sum(_size(v.aval) for v in outs)
  if name == "dot_general":
    (lc, _), _ = params["dimension_numbers"]
    lhs = eqn.invars[0].aval
    k = int(np.prod([lhs.shape[i] for i in lc], dtype=np.int64)) if lc else 1
    flops = 2.0 * out_elems * k
    return EqnCost(flops, moved, flops)
  if name == "conv_general_dilated":
    rhs = eqn.invars[1].aval
    out_feature_dim = params["dimension_numbers"].rhs_spec[0]
    per_out = _size(rhs) / max(1, rhs.shape[out_feature_dim])
    flops = 2.0 * out_elems * per_out
    return EqnCost(flops, moved, flops)
  if name in _REDUCTIONS:
    flops = float(sum(_size(v.aval) for v in eqn.invars
                      if not compat.is_literal(v)))
    return EqnCost(flops, moved)
  factor = TRANSCENDENTAL_FLOPS if name in _TRANSCENDENTAL else 1
  return EqnCost(float(out_elems * factor), moved)


def analytic_costs(eqns: Sequence[Any]) -> list[EqnCost]:
  """Roofline work of each equation."""
  return [eqn_cost(e) for e in eqns]


__all__ = ["EqnCost", "TRANSCENDENTAL_FLOPS", "ZERO", "analytic_costs",
           "eqn_cost", "nbytes"]
