"""Row coupling: does a block's work stay independent across batch rows?

A block on ``g`` devices may split a micro-batch's rows over them only when
every output row depends on the same input row alone (and nothing depends on
where a row sits in the batch). This pass follows the micro-batch axis
through a jaxpr: each value is *independent* of the batch (``None``), carries
the batch along one axis (an ``int``), or *mixes* rows (:data:`MIXED`: it
depends on the batch but no axis maps one-to-one to the batch rows).

Anything that reduces, sorts, cumulates, scans, slices or gathers across the
batch axis mixes rows; so does a random draw or an ``iota`` whose shape spans
the micro-batch rows (a split would draw other bits / count other
positions), and any primitive not known here that reads a batch-carrying
value. The first such equation is the block's *reason*. One kind of
cross-row work is kept apart: a ``reduce_sum`` over the batch axis followed
only by linear operations with batch-independent coefficients (a mean loss)
is :data:`SUMMED`; the devices' partial values of such an output add up to
it (``passes.modes`` lets such a block split when only the epilogue reads
the sum).

Only jaxpr objects are read (equations, variables, avals, parameters), via
``tessel_jax.compat`` helpers where JAX has no public accessor.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

from tessel_jax import compat

from .row_positions import (ELEMENTWISE, NO_POS, Pos, nout, pos_meets_batch,
                            pos_rule, prim, prod, shape)

MIXED = -1
"""Axis state of a value that depends on the batch rows without an axis."""

SUMMED = -2
"""Axis state of a linear function of a sum over the batch rows (a mean
loss): split devices' partial sums add up to it, so a block whose only
cross-row work is such an output may still split its rows."""

Axis = int | None


@dataclasses.dataclass(frozen=True)
class RowCoupling:
  """What :func:`analyze` found.

  Attributes:
    coupled: Some equation mixes rows (or reads a value that does); a sum
      over the rows that reaches an output through linear operations only
      (:data:`SUMMED`) does not count.
    reason: The first such equation, e.g. ``"reduce_sum over the batch
      axis, then sub"`` (empty when not coupled).
    out_axes: Per output: the batch axis, ``None`` (independent of the
      batch), :data:`MIXED` or :data:`SUMMED`.
  """

  coupled: bool
  reason: str
  out_axes: tuple[Axis, ...]


def analyze(jaxpr: Any, in_axes: Sequence[Axis], rows: int) -> RowCoupling:
  """Follows the micro-batch axis through ``jaxpr``.

  Args:
    jaxpr: A ``Jaxpr`` or ``ClosedJaxpr`` (constants are independent).
    in_axes: Per invar: batch axis, ``None`` or :data:`MIXED`.
    rows: Micro-batch rows (the batch axis' size; random draws and iotas
      with an axis of this size count as drawn over the batch).

  Returns:
    The :class:`RowCoupling` of the outputs.
  """
  body = jaxpr.jaxpr if isinstance(jaxpr, compat.ClosedJaxpr) else jaxpr
  outs, reason = _run(body, list(in_axes), rows)
  if reason is None and MIXED in in_axes:
    reason = "reads a value that already mixes the batch rows"
  return RowCoupling(reason is not None, reason or "", tuple(outs))


def analyze_eqns(eqns: Sequence[Any], invars: Sequence[Any],
                 outvars: Sequence[Any], in_axes: Sequence[Axis],
                 rows: int) -> RowCoupling:
  """:func:`analyze` for a slice of equations (a partition block)."""
  env = dict(zip(invars, in_axes))
  reason = _run_eqns(eqns, env, {}, rows)
  outs = [_read(env, v) for v in outvars]
  if reason is None and MIXED in in_axes:
    reason = "reads a value that already mixes the batch rows"
  return RowCoupling(reason is not None, reason or "", tuple(outs))


# --- the walk -------------------------------------------------------------
#
# Besides the batch axis of every value, the walk keeps *positional* axes of
# batch-independent values: axes of the micro-batch's size along which an
# ``iota`` counts or random bits differ (``Pos``: axes and the source's
# name). They are harmless until they meet the batch axis of a value (a
# split would count or draw other values for the same rows).

def _read(env: dict[Any, Axis], v: Any) -> Axis:
  if compat.is_literal(v):
    return None
  return env.get(v)


def _run(jaxpr: Any, in_axes: list[Axis], rows: int,
         in_pos: Sequence[Pos] | None = None
         ) -> tuple[list[Axis], str | None]:
  outs, reason, _ = _run_pos(jaxpr, in_axes, rows, in_pos)
  return outs, reason


def _run_pos(jaxpr: Any, in_axes: list[Axis], rows: int,
             in_pos: Sequence[Pos] | None = None
             ) -> tuple[list[Axis], str | None, list[Pos]]:
  env: dict[Any, Axis] = dict(zip(jaxpr.invars, in_axes))
  pos: dict[Any, Pos] = {v: p for v, p in zip(jaxpr.invars, in_pos or ())
                         if p[0]}
  reason = _run_eqns(jaxpr.eqns, env, pos, rows)
  return ([_read(env, v) for v in jaxpr.outvars], reason,
          [NO_POS if compat.is_literal(v) else pos.get(v, NO_POS)
           for v in jaxpr.outvars])


def _run_eqns(eqns: Sequence[Any], env: dict[Any, Axis],
              pos: dict[Any, Pos], rows: int) -> str | None:
  reason = None
  for eqn in eqns:
    ins = [_read(env, v) for v in eqn.invars]
    ins_pos = [NO_POS if compat.is_literal(v) else pos.get(v, NO_POS)
               for v in eqn.invars]
    if prim(eqn) in _CALLS and compat.sub_jaxprs(eqn):
      outs, why, out_pos = _call_pos(eqn, ins, ins_pos, rows)
    else:
      outs, why = _eqn(eqn, ins, rows)
      if why is None and any(p[0] for p in ins_pos):
        why = pos_meets_batch(eqn, ins, ins_pos)
      out_pos = (pos_rule(eqn, ins_pos, rows)
                 if all(a is None for a in ins) else [NO_POS] * nout(eqn))
    if reason is None and why is not None:
      reason = why
    for v, a, p in zip(eqn.outvars, outs, out_pos):
      if not compat.is_dropvar(v):
        env[v] = a
        if p[0]:
          pos[v] = p
  return reason


Result = tuple[list[Axis], str | None]


def _mixed(eqn: Any, why: str | None) -> Result:
  return [MIXED] * nout(eqn), why


def _same(eqn: Any, a: Axis) -> Result:
  return [a] * nout(eqn), None


def _eqn(eqn: Any, ins: list[Axis], rows: int) -> Result:
  """Output axis states of one equation and why it mixes rows (if it does)."""
  name = prim(eqn)
  if all(a is None for a in ins):
    return [None] * nout(eqn), None
  if MIXED in ins:
    return _mixed(eqn, None)  # already reported where the mixing began
  if SUMMED in ins:
    return _summed(eqn, ins, rows)
  if name == "reduce_sum":
    a = next(x for x in ins if x is not None)
    if a in tuple(compat.eqn_params(eqn)["axes"]):
      return [SUMMED], None
  rule = _RULES.get(name)
  if rule is None:
    if name in ELEMENTWISE:
      return _elementwise(eqn, ins, rows)
    return _mixed(eqn, f"{name} (not known to keep rows apart) reads the"
                  f" batch")
  return rule(eqn, ins, rows)


def _call_pos(eqn: Any, ins: list[Axis], ins_pos: list[Pos], rows: int
              ) -> tuple[list[Axis], str | None, list[Pos]]:
  """jit / closed_call / custom_jvp / custom_vjp / remat: the body."""
  body = compat.sub_jaxprs(eqn)[0]
  if len(body.invars) != len(ins):
    outs, why = _mixed(eqn, f"{prim(eqn)} with an unreadable body reads the"
                       f" batch")
    return outs, why, [NO_POS] * nout(eqn)
  outs, why, out_pos = _run_pos(body, list(ins), rows, ins_pos)
  if why is not None:
    why = f"{why} (inside {prim(eqn)})"
  return outs, why, out_pos


# --- rules ----------------------------------------------------------------


_LINEAR_UNARY = frozenset({
    "neg", "convert_element_type", "copy", "copy_p", "reduce_sum",
    "broadcast_in_dim", "reshape", "squeeze", "transpose", "reduce_precision",
    "tessel_boundary", "optimization_barrier", "pcast", "pvary"})


def _summed(eqn: Any, ins: list[Axis], rows: int) -> Result:
  """A sum over the rows stays :data:`SUMMED` through linear operations
  with batch-independent coefficients; anything else mixes rows."""
  name = prim(eqn)
  kinds = {"sum" if a == SUMMED else "free" if a is None else "rows"
           for a in ins}
  ok = False
  if name in _LINEAR_UNARY:
    ok = ins[0] == SUMMED and all(a is None for a in ins[1:])
  elif name in ("add", "sub", "add_any"):
    ok = kinds == {"sum"}
  elif name in ("mul", "dot_general"):
    ok = sorted(ins, key=str) == sorted([SUMMED, None], key=str)
  elif name == "div":
    ok = ins[0] == SUMMED and ins[1] is None
  elif name in _RULES and _RULES[name] is _call:
    return _call(eqn, ins, rows)
  if ok and name == "convert_element_type":
    ok = _is_float(eqn.outvars[0])
  if ok:
    return [SUMMED] * nout(eqn), None
  return _mixed(eqn, f"reduce_sum over the batch axis, then {name}")


def _is_float(v: Any) -> bool:
  return "float" in str(getattr(v.aval, "dtype", ""))


def _elementwise(eqn: Any, ins: list[Axis], rows: int) -> Result:
  del rows
  rank = len(shape(eqn.outvars[0]))
  axes = set()
  for v, a in zip(eqn.invars, ins):
    if a is None:
      continue
    if len(shape(v)) != rank:
      return _mixed(eqn, f"{prim(eqn)} broadcasts the batch axis")
    axes.add(a)
  if len(axes) > 1:
    return _mixed(eqn, f"{prim(eqn)} combines values carrying the batch on"
                  f" axes {sorted(axes)}")
  return _same(eqn, axes.pop())


def _one(ins: list[Axis]) -> tuple[int, Axis]:
  """Position and axis of the only batch-carrying operand considered."""
  for i, a in enumerate(ins):
    if a is not None:
      return i, a
  raise ValueError("no batch operand")


def _broadcast_in_dim(eqn: Any, ins: list[Axis], rows: int) -> Result:
  del rows
  a = ins[0]
  if a is None:
    return _mixed(eqn, "broadcast_in_dim with a batch-dependent shape")
  dims = compat.eqn_params(eqn)["broadcast_dimensions"]
  out = dims[a]
  if shape(eqn.outvars[0])[out] != shape(eqn.invars[0])[a]:
    return _mixed(eqn, "broadcast_in_dim broadcasts the batch axis")
  return _same(eqn, out)


def _reshape(eqn: Any, ins: list[Axis], rows: int) -> Result:
  del rows
  a = ins[0]
  if a is None or compat.eqn_params(eqn).get("dimensions") is not None:
    return _mixed(eqn, "reshape with a batch-dependent shape")
  src, dst = shape(eqn.invars[0]), shape(eqn.outvars[0])
  pre = prod(src[:a])
  for d in range(len(dst)):
    if prod(dst[:d]) == pre and dst[d] == src[a]:
      return _same(eqn, d)
  return _mixed(eqn, "reshape merges the batch axis with another axis")


def _transpose(eqn: Any, ins: list[Axis], rows: int) -> Result:
  del rows
  perm = tuple(compat.eqn_params(eqn)["permutation"])
  return _same(eqn, perm.index(ins[0]))


def _squeeze(eqn: Any, ins: list[Axis], rows: int) -> Result:
  del rows
  dims = [d % len(shape(eqn.invars[0]))
          for d in compat.eqn_params(eqn)["dimensions"]]
  a = ins[0]
  if a in dims:
    return _mixed(eqn, "squeeze removes the batch axis")
  return _same(eqn, a - sum(d < a for d in dims))


def _axes_rule(key: str, what: str, removes: bool) -> Callable[..., Result]:
  """Reductions (``removes``) and same-shape ops along ``params[key]``."""
  def rule(eqn: Any, ins: list[Axis], rows: int) -> Result:
    del rows
    p = compat.eqn_params(eqn)[key]
    axes = tuple(p) if isinstance(p, (tuple, list)) else (p,)
    i, a = _one(ins)
    if any(x is not None for j, x in enumerate(ins) if j != i and x != a):
      return _mixed(eqn, f"{prim(eqn)} combines different batch axes")
    if a in axes:
      return _mixed(eqn, f"{prim(eqn)} {what} the batch axis")
    return _same(eqn, a - sum(x < a for x in axes) if removes else a)
  return rule


def _split(eqn: Any, ins: list[Axis], rows: int) -> Result:
  return _axes_rule("axis", "over", False)(eqn, ins, rows)


def _top_k(eqn: Any, ins: list[Axis], rows: int) -> Result:
  del rows
  if ins[0] == len(shape(eqn.invars[0])) - 1:
    return _mixed(eqn, "top_k over the batch axis")
  return _same(eqn, ins[0])


def _dot_general(eqn: Any, ins: list[Axis], rows: int) -> Result:
  del rows
  (lc, rc), (lb, rb) = compat.eqn_params(eqn)["dimension_numbers"]
  al, ar = ins[0], ins[1]
  nl, nr = len(shape(eqn.invars[0])), len(shape(eqn.invars[1]))
  if (al is not None and al in lc) or (ar is not None and ar in rc):
    return _mixed(eqn, "dot_general contracts the batch axis")
  lfree = [d for d in range(nl) if d not in lc and d not in lb]
  rfree = [d for d in range(nr) if d not in rc and d not in rb]
  out_l = (lb.index(al) if al in lb else len(lb) + lfree.index(al)
           ) if al is not None else None
  out_r = (rb.index(ar) if ar in rb else len(lb) + len(lfree) +
           rfree.index(ar)) if ar is not None else None
  if out_l is not None and out_r is not None and out_l != out_r:
    return _mixed(eqn, "dot_general pairs every row with every other row")
  return _same(eqn, out_l if out_l is not None else out_r)


def _conv(eqn: Any, ins: list[Axis], rows: int) -> Result:
  del rows
  p = compat.eqn_params(eqn)
  lhs_spec, _, out_spec = p["dimension_numbers"]
  if ins[1] is not None or ins[0] != lhs_spec[0] or p.get(
      "batch_group_count", 1) != 1:
    return _mixed(eqn, "conv_general_dilated mixes the batch axis")
  return _same(eqn, out_spec[0])


def _slice(eqn: Any, ins: list[Axis], rows: int) -> Result:
  del rows
  a = ins[0]
  p = compat.eqn_params(eqn)
  size = shape(eqn.invars[0])[a]
  strides = p.get("strides") or (1,) * len(shape(eqn.invars[0]))
  if (p["start_indices"][a], p["limit_indices"][a], strides[a]) != (0, size, 1):
    return _mixed(eqn, "slice over the batch axis")
  return _same(eqn, a)


def _pad(eqn: Any, ins: list[Axis], rows: int) -> Result:
  del rows
  if ins[1] is not None:
    return _mixed(eqn, "pad with a batch-dependent padding value")
  if tuple(compat.eqn_params(eqn)["padding_config"][ins[0]]) != (0, 0, 0):
    return _mixed(eqn, "pad along the batch axis")
  return _same(eqn, ins[0])


def _concatenate(eqn: Any, ins: list[Axis], rows: int) -> Result:
  dim = compat.eqn_params(eqn)["dimension"]
  if dim in ins:
    return _mixed(eqn, "concatenate along the batch axis")
  return _elementwise(eqn, ins, rows)


def _dynamic_slice(eqn: Any, ins: list[Axis], rows: int) -> Result:
  del rows
  a = ins[0]
  if a is None or any(x is not None for x in ins[1:]):
    return _mixed(eqn, "dynamic_slice at a batch-dependent index")
  if shape(eqn.outvars[0])[a] != shape(eqn.invars[0])[a]:
    return _mixed(eqn, "dynamic_slice over the batch axis")
  return _same(eqn, a)


def _dynamic_update_slice(eqn: Any, ins: list[Axis], rows: int) -> Result:
  del rows
  if any(x is not None for x in ins[2:]):
    return _mixed(eqn, "dynamic_update_slice at a batch-dependent index")
  a = ins[0] if ins[0] is not None else ins[1]
  if ins[1] is not None and ins[1] != a:
    return _mixed(eqn, "dynamic_update_slice moves the batch axis")
  if shape(eqn.invars[1])[a] != shape(eqn.invars[0])[a]:
    return _mixed(eqn, "dynamic_update_slice over the batch axis")
  return _same(eqn, a)


def _gather(eqn: Any, ins: list[Axis], rows: int) -> Result:
  del rows
  p = compat.eqn_params(eqn)
  dn = p["dimension_numbers"]
  a, ai = ins[0], ins[1]
  out_rank = len(shape(eqn.outvars[0]))
  op_rank = len(shape(eqn.invars[0]))
  batch_out = [d for d in range(out_rank) if d not in dn.offset_dims]
  idx_last = len(shape(eqn.invars[1])) - 1
  out = None
  if ai is not None:
    if ai == idx_last:
      return _mixed(eqn, "gather with the batch in its index vector")
    out = batch_out[ai]
    if a is not None:
      ob, ib = tuple(dn.operand_batching_dims), tuple(
          dn.start_indices_batching_dims)
      if a not in ob or ai not in ib or ob.index(a) != ib.index(ai):
        return _mixed(eqn, "gather across the batch axis")
    return _same(eqn, out)
  kept = [d for d in range(op_rank) if d not in dn.collapsed_slice_dims and
          d not in dn.operand_batching_dims]
  if (a in dn.start_index_map or a not in kept or
      p["slice_sizes"][a] != shape(eqn.invars[0])[a]):
    return _mixed(eqn, "gather across the batch axis")
  return _same(eqn, dn.offset_dims[kept.index(a)])


def _reduce_window(eqn: Any, ins: list[Axis], rows: int) -> Result:
  del rows
  p = compat.eqn_params(eqn)
  _, a = _one(ins)
  win = p["window_dimensions"][a]
  stride = p["window_strides"][a]
  same = all(shape(v)[a] == shape(eqn.invars[0])[a] for v in eqn.outvars)
  if (win, stride) != (1, 1) or not same or any(
      x is not None and x != a for x in ins):
    return _mixed(eqn, f"{prim(eqn)} slides a window over the batch axis")
  return _same(eqn, a)


def _key_shape_rule(eqn: Any, ins: list[Axis], rows: int) -> Result:
  """random_bits / random_split / random_unwrap / random_wrap: the key's
  leading axes come first in the output."""
  del rows
  a = ins[0]
  if any(x is not None for x in ins[1:]):
    return _elementwise(eqn, ins, 0)
  if prim(eqn) == "random_wrap" and a == len(shape(eqn.invars[0])) - 1:
    return _mixed(eqn, "random_wrap over the batch axis")
  return _same(eqn, a)


def _identity_multi(eqn: Any, ins: list[Axis], rows: int) -> Result:
  del rows
  return list(ins)[:nout(eqn)], None


def _call(eqn: Any, ins: list[Axis], rows: int) -> Result:
  """jit / closed_call / custom_jvp / custom_vjp / remat: the body."""
  subs = compat.sub_jaxprs(eqn)
  body = subs[0] if subs else None
  if body is None or len(body.invars) != len(ins):
    return _mixed(eqn, f"{prim(eqn)} with an unreadable body reads the"
                  f" batch")
  outs, why = _run(body, list(ins), rows)
  if why is not None:
    why = f"{why} (inside {prim(eqn)})"
  return outs, why


def _inner_sum(outs: Sequence[Axis], name: str) -> str | None:
  """A sum over the rows leaving a loop or branch is not followed further."""
  if SUMMED in outs:
    return f"reduce_sum over the batch axis inside {name}"
  return None


def _join(a: Axis, b: Axis) -> Axis:
  if a is None:
    return b
  if b is None or a == b:
    return a
  return MIXED


def _cond(eqn: Any, ins: list[Axis], rows: int) -> Result:
  if ins[0] is not None:
    return _mixed(eqn, "cond whose branch depends on the batch")
  outs: list[Axis] | None = None
  for br in compat.sub_jaxprs(eqn):
    o, why = _run(br, list(ins[1:]), rows)
    why = why or _inner_sum(o, "cond")
    if why is not None:
      return _mixed(eqn, f"{why} (inside cond)")
    outs = o if outs is None else [_join(x, y) for x, y in zip(outs, o)]
  outs = outs or [None] * nout(eqn)
  if MIXED in outs:
    return _mixed(eqn, "cond branches put the batch on different axes")
  return outs, None


def _scan(eqn: Any, ins: list[Axis], rows: int) -> Result:
  _, nc, ncar, _ = compat.scan_layout(eqn)
  body = compat.scan_body(eqn).jaxpr
  xs = ins[nc + ncar:]
  if 0 in xs:
    return _mixed(eqn, "scan over the batch axis")
  xs = [None if a is None else a - 1 for a in xs]
  carry = list(ins[nc:nc + ncar])
  for _ in range(len(carry) + 2):
    outs, why = _run(body, list(ins[:nc]) + carry + xs, rows)
    why = why or _inner_sum(outs, "scan")
    if why is not None:
      return _mixed(eqn, f"{why} (inside scan)")
    new = [_join(c, o) for c, o in zip(carry, outs[:ncar])]
    if MIXED in new:
      return _mixed(eqn, "scan moves the batch axis of its carry")
    if new == carry:
      ys = [None if a is None else a + 1 for a in outs[ncar:]]
      return carry + ys, None
    carry = new
  return _mixed(eqn, "scan carry does not settle")


def _while(eqn: Any, ins: list[Axis], rows: int) -> Result:
  p = compat.eqn_params(eqn)
  cn, bn = p["cond_nconsts"], p["body_nconsts"]
  cond, body = p["cond_jaxpr"].jaxpr, p["body_jaxpr"].jaxpr
  cconsts, bconsts = ins[:cn], ins[cn:cn + bn]
  carry = list(ins[cn + bn:])
  for _ in range(len(carry) + 2):
    pred, why = _run(cond, list(cconsts) + carry, rows)
    if why is not None or pred[0] is not None:
      return _mixed(eqn, "while loop whose trip count depends on the batch")
    outs, why = _run(body, list(bconsts) + carry, rows)
    why = why or _inner_sum(outs, "while")
    if why is not None:
      return _mixed(eqn, f"{why} (inside while)")
    new = [_join(c, o) for c, o in zip(carry, outs)]
    if MIXED in new:
      return _mixed(eqn, "while loop moves the batch axis of its carry")
    if new == carry:
      return carry, None
    carry = new
  return _mixed(eqn, "while carry does not settle")


def _select_n(eqn: Any, ins: list[Axis], rows: int) -> Result:
  return _elementwise(eqn, ins, rows)


def _clamp(eqn: Any, ins: list[Axis], rows: int) -> Result:
  return _elementwise(eqn, ins, rows)


def _bitcast(eqn: Any, ins: list[Axis], rows: int) -> Result:
  del rows
  a = ins[0]
  if a >= len(shape(eqn.outvars[0])) or shape(
      eqn.outvars[0])[a] != shape(eqn.invars[0])[a]:
    return _mixed(eqn, "bitcast_convert_type reshapes the batch axis")
  return _same(eqn, a)


def _rev(eqn: Any, ins: list[Axis], rows: int) -> Result:
  return _axes_rule("dimensions", "over", False)(eqn, ins, rows)


def _sort(eqn: Any, ins: list[Axis], rows: int) -> Result:
  return _axes_rule("dimension", "over", False)(eqn, ins, rows)


def _cumulative(eqn: Any, ins: list[Axis], rows: int) -> Result:
  return _axes_rule("axis", "over", False)(eqn, ins, rows)


def _reduce(eqn: Any, ins: list[Axis], rows: int) -> Result:
  return _axes_rule("axes", "over", True)(eqn, ins, rows)


_CALLS = frozenset({"jit", "pjit", "closed_call", "core_call",
                    "custom_jvp_call", "custom_vjp_call",
                    "custom_vjp_call_jaxpr", "remat", "remat2", "checkpoint"})

_RULES: dict[str, Callable[..., Result]] = {
    "broadcast_in_dim": _broadcast_in_dim,
    "reshape": _reshape,
    "transpose": _transpose,
    "squeeze": _squeeze,
    "rev": _rev,
    "reduce_sum": _reduce, "reduce_max": _reduce, "reduce_min": _reduce,
    "reduce_prod": _reduce, "reduce_and": _reduce, "reduce_or": _reduce,
    "reduce_xor": _reduce, "argmax": _reduce, "argmin": _reduce,
    "cumsum": _cumulative, "cumprod": _cumulative, "cummax": _cumulative,
    "cummin": _cumulative, "cumlogsumexp": _cumulative,
    "sort": _sort,
    "top_k": _top_k,
    "split": _split,
    "dot_general": _dot_general,
    "conv_general_dilated": _conv,
    "slice": _slice,
    "pad": _pad,
    "concatenate": _concatenate,
    "dynamic_slice": _dynamic_slice,
    "dynamic_update_slice": _dynamic_update_slice,
    "gather": _gather,
    "reduce_window_sum": _reduce_window, "reduce_window_max": _reduce_window,
    "reduce_window_min": _reduce_window, "reduce_window": _reduce_window,
    "select_n": _select_n,
    "clamp": _clamp,
    "bitcast_convert_type": _bitcast,
    "random_bits": _key_shape_rule, "random_split": _key_shape_rule,
    "random_wrap": _key_shape_rule, "random_unwrap": _key_shape_rule,
    "random_fold_in": _key_shape_rule,
    "jit": _call, "pjit": _call, "closed_call": _call, "core_call": _call,
    "custom_jvp_call": _call, "custom_vjp_call": _call,
    "custom_vjp_call_jaxpr": _call, "remat": _call, "remat2": _call,
    "checkpoint": _call,
    "cond": _cond,
    "scan": _scan,
    "while": _while,
    "tessel_boundary": _identity_multi,
    "optimization_barrier": _identity_multi,
    "sharding_constraint": _identity_multi,
    "pcast": _identity_multi, "pvary": _identity_multi,
    "stop_gradient": _identity_multi,
    "mesh_cast": _identity_multi, "reshard": _identity_multi,
}
