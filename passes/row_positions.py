"""Positional axes: where an ``iota`` or a random draw spans the batch size.

A batch-independent value may still differ along an axis of the
micro-batch's size: an ``iota`` counting along it, random bits drawn with
that shape. Splitting the rows would count or draw other values for the same
rows, but only where such an axis meets the batch axis of another value in
one operation (a causal mask of ``seq == rows`` does not). ``passes.rows``
keeps these axes per value (:data:`Pos`: axes and the source's name) and
asks :func:`pos_meets_batch` at every equation reading both.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from tessel_jax import compat

Pos = tuple[frozenset, str]
NO_POS: Pos = (frozenset(), "")


def nout(eqn: Any) -> int:
  return len(eqn.outvars)


def prim(eqn: Any) -> str:
  return compat.primitive_name(eqn)


def shape(v: Any) -> tuple[int, ...]:
  return tuple(getattr(v.aval, "shape", ()))


def prod(xs: Sequence[int]) -> int:
  out = 1
  for x in xs:
    out *= int(x)
  return out


ELEMENTWISE = frozenset("""
abs acos acosh add and asin asinh atan atan2 atanh bessel_i0e bessel_i1e cbrt
ceil clz complex conj convert_element_type copy copy_p cos cosh digamma div
eq erf erf_inv erfc exp exp2 expm1 floor ge gt igamma igamma_grad_a igammac
imag integer_pow is_finite le lgamma log log1p logistic lt max min mul ne neg
nextafter not or polygamma population_count pow real reduce_precision rem
round rsqrt shift_left shift_right_arithmetic shift_right_logical sign sin
sinh sqrt square sub tan tanh xor zeta random_gamma_grad
regularized_incomplete_beta threefry2x32 random_fold_in random_seed
square erf_inv
""".split())

SOURCES = frozenset({"iota", "random_bits", "rng_bit_generator",
                      "rng_uniform", "threefry2x32"})

ALIGNED = frozenset({"select_n", "clamp", "concatenate",
                     "dynamic_update_slice", "convert_element_type"})


def pos_meets_batch(eqn: Any, ins: list[int | None], ins_pos: list[Pos]
                    ) -> str | None:
  """Why a positional value meets the batch axis in ``eqn`` (None: it
  does not). Elementwise-like operations compare axes; others meeting both
  count as meeting."""
  name = prim(eqn)
  rank = len(shape(eqn.outvars[0])) if eqn.outvars else 0
  batch = {a for a in ins if a is not None and a >= 0}
  if not batch:
    return None
  aligned = name in ELEMENTWISE or name in ALIGNED
  for v, (axes, src) in zip(eqn.invars, ins_pos):
    if not axes:
      continue
    if aligned and len(shape(v)) == rank and not axes & batch:
      continue
    return (f"{src} makes an array over the batch axis that {name} combines"
            f" with the batch (a split would draw or count other values)")
  return None


def pos_rule(eqn: Any, ins_pos: list[Pos], rows: int) -> list[Pos]:
  """Positional axes of a batch-independent equation's outputs."""
  name = prim(eqn)
  n = nout(eqn)
  if rows <= 1:
    return [NO_POS] * n
  if name in SOURCES:
    return [source_pos(eqn, v, rows) for v in eqn.outvars]
  live = [(v, p) for v, p in zip(eqn.invars, ins_pos) if p[0]]
  nested = nested_source(eqn, rows)
  if not live and not nested:
    return [NO_POS] * n
  src = live[0][1][1] if live else nested
  if live and n == 1:
    moved = move_pos(eqn, live, rows)
    if moved is not None:
      return [(moved, src) if moved else NO_POS]
  return [(frozenset(d for d, size in enumerate(shape(v)) if size == rows),
           src) for v in eqn.outvars]


def source_pos(eqn: Any, v: Any, rows: int) -> Pos:
  dims = shape(v)
  if prim(eqn) == "iota":  # counts along one dimension only
    d = compat.eqn_params(eqn)["dimension"]
    axes = {d} if dims[d] == rows else set()
  else:
    axes = {d for d, size in enumerate(dims) if size == rows}
  return (frozenset(axes), prim(eqn)) if axes else NO_POS


def nested_source(eqn: Any, rows: int) -> str:
  """Name of an iota / random draw of the batch's size nested in ``eqn``."""
  stack = [e for sub in compat.sub_jaxprs(eqn) for e in sub.eqns]
  while stack:
    e = stack.pop()
    if prim(e) in SOURCES and any(
        source_pos(e, v, rows)[0] for v in e.outvars):
      return prim(e)
    stack.extend(x for sub in compat.sub_jaxprs(e) for x in sub.eqns)
  return ""


def move_pos(eqn: Any, live: list[tuple[Any, Pos]], rows: int
              ) -> frozenset | None:
  """Positional axes through a shape operation (None: not followed)."""
  del rows
  name = prim(eqn)
  out_rank = len(shape(eqn.outvars[0]))
  p = compat.eqn_params(eqn)
  if name in ELEMENTWISE or name in ALIGNED:
    if all(len(shape(v)) == out_rank for v, _ in live):
      return frozenset().union(*(pp[0] for _, pp in live))
    return None
  v, (axes, _) = live[0]
  if len(live) != 1:
    return None
  if name == "broadcast_in_dim":
    return frozenset(p["broadcast_dimensions"][a] for a in axes)
  if name == "transpose":
    return frozenset(tuple(p["permutation"]).index(a) for a in axes)
  if name == "gather" and v is eqn.invars[1]:
    return _gather_index_pos(p["dimension_numbers"], len(shape(v)), out_rank,
                             axes)
  if name in ("reduce_sum", "reduce_max", "reduce_min", "reduce_prod",
              "argmax", "argmin", "squeeze"):
    gone = tuple(p["axes"] if "axes" in p else p["dimensions"])
    gone = tuple(d % len(shape(v)) for d in gone)
    return frozenset(a - sum(d < a for d in gone) for a in axes
                     if a not in gone)
  if name == "reshape" and p.get("dimensions") is None:
    src, dst = shape(v), shape(eqn.outvars[0])
    out = set()
    for a in axes:
      hit = [d for d in range(len(dst))
             if prod(dst[:d]) == prod(src[:a]) and dst[d] == src[a]]
      if not hit:
        return None
      out.add(hit[0])
    return frozenset(out)
  return None


def _gather_index_pos(dnums: Any, index_rank: int, out_rank: int,
                      axes: frozenset) -> frozenset | None:
  """Positional axes of a gather's indices -> its output's (an embedding
  lookup of position ids): each index dimension but the last (the index
  vector) is one output dimension outside ``offset_dims``, in order."""
  if getattr(dnums, "operand_batching_dims", ()):
    return None
  batch_dims = [d for d in range(out_rank) if d not in dnums.offset_dims]
  if (any(a >= index_rank - 1 for a in axes) or
      len(batch_dims) != index_rank - 1):
    return None
  return frozenset(batch_dims[a] for a in axes)
