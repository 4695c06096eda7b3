"""Convolutions in the dimension order XLA:CPU runs fast inside the ticks.

XLA's CPU backend runs a convolution with Eigen (or YNNPACK) only in its
canonical order: input ``batch, spatial..., feature``, kernel ``spatial...,
in, out``, output ``batch, spatial..., feature``. Its pass
``ConvCanonicalization`` transposes other convolutions into that order,
but it walks the entry computation alone: a convolution in a
``conditional`` branch or a ``while`` body -- where every tick runs its
kernels -- keeps its order and runs as a generic loop. JAX's transpose
rules always emit such orders for the backward: the weight gradient
(``f01b_i01o->01bf`` in XLA's labels: the batch contracted as a feature)
and the input gradient (``b01f_01oi->b01f``: the kernel's in and out
swapped). One 3x3x64x64 weight gradient on an 8x8 map of 4 rows: 0.36 ms
at the top level, 6.2 ms in a ``lax.cond`` branch, 0.37 ms in the branch
in the canonical order (BENCHMARKS.md, helper "resnet9").

:func:`rewrite` re-traces a block's top-level ``conv_general_dilated``
equations (f32/f16, 1-3 spatial dimensions) through :func:`conv`, a
``jax.custom_vjp`` whose forward and backward convolutions are bound in
the canonical order between explicit transposes (:func:`canonical`):
what ``ConvCanonicalization`` does at the top level, done in the jaxpr so
that it holds in the branches too. The backward is JAX's own
(``jax.vjp`` of the plain convolution, traced once per call and
re-bound), so the values are the same sums in the same order.
"""

from __future__ import annotations

import weakref
from collections.abc import Sequence
from typing import Any

import jax
import numpy as np
from jax import lax

from tessel_jax import compat

from . import block_rebind

_CONV = "conv_general_dilated"
_DTYPES = (np.dtype(np.float32), np.dtype(np.float16))


def canonical_specs(ndim: int) -> tuple[tuple[int, ...], ...]:
  """``(lhs_spec, rhs_spec, out_spec)`` of the canonical order for
  ``ndim``-dimensional operands, in ``lax.ConvDimensionNumbers`` terms
  (``(batch or out, feature or in, spatial...)``)."""
  spatial = tuple(range(1, ndim - 1))
  return ((0, ndim - 1) + spatial, (ndim - 1, ndim - 2) +
          tuple(range(ndim - 2)), (0, ndim - 1) + spatial)


def is_canonical(dimension_numbers: Any, ndim: int) -> bool:
  """Whether a convolution's dimension numbers are XLA:CPU's fast order."""
  return tuple(tuple(s) for s in dimension_numbers) == canonical_specs(ndim)


def _order(spec: Sequence[int], kernel: bool) -> tuple[int, ...]:
  """The permutation taking operand dims to the canonical order."""
  if kernel:
    return tuple(spec[2:]) + (spec[1], spec[0])
  return (spec[0],) + tuple(spec[2:]) + (spec[1],)


def swapped(eqn: Any, lhs_shape: Sequence[int], rhs_shape: Sequence[int]
            ) -> bool:
  """Whether XLA's algebraic simplifier swaps the operands of ``eqn`` (a
  convolution in the canonical order on these shapes): its kernel covers
  more positions than its input (``SwapConvOperands``: padded, dilated or
  strided dimensions counted, pure contractions not). The swapped
  convolution reverses its window and runs as a generic loop wherever it
  is (a 3x3 on a 2x2 map: 4.7 ms against 0.6 ms as :func:`patches_dot`)."""
  p = compat.eqn_params(eqn)
  if p["feature_group_count"] != 1 or p["batch_group_count"] != 1:
    return False
  nsp = len(lhs_shape) - 2
  ld = p["lhs_dilation"] or (1,) * nsp
  rd = p["rhs_dilation"] or (1,) * nsp
  kernel = inputs = 1
  for i, (lo, hi) in enumerate(p["padding"]):
    k, n, s = rhs_shape[i], lhs_shape[1 + i], p["window_strides"][i]
    plain = lo == 0 and hi == 0 and rd[i] == 1
    if plain and ((ld[i] == k and s == k - 1) or
                  (k == n and ld[i] == 1 and s == 1)):
      continue
    kernel *= k
    inputs *= k if (n == 1 and s == 1 and rd[i] == 1 and
                    lo == hi == k - 1) else n
  return kernel > inputs


def canonical(lhs: Any, rhs: Any, eqn: Any) -> list[Any]:
  """``eqn`` (a convolution) on ``lhs, rhs`` in the canonical order
  between transposes: a convolution, or :func:`patches_dot` where XLA
  would swap its operands (:func:`swapped`)."""
  dn = compat.eqn_params(eqn)["dimension_numbers"]
  ndim = len(lhs.shape)
  lhs_spec, rhs_spec, out_spec = dn
  x = lax.transpose(lhs, _order(lhs_spec, False))
  w = lax.transpose(rhs, _order(rhs_spec, True))
  if swapped(eqn, x.shape, w.shape):
    out = patches_dot(x, w, eqn)
  elif is_canonical(dn, ndim):
    return compat.bind_eqn(eqn, [lhs, rhs])
  else:
    out = compat.bind_eqn(
        eqn, [x, w],
        dimension_numbers=lax.ConvDimensionNumbers(*canonical_specs(ndim)))[0]
  return [lax.transpose(out, tuple(np.argsort(_order(out_spec, False))))]


def applies(eqn: Any) -> bool:
  """Whether :func:`rewrite` rebinds ``eqn``: a convolution of f32 or f16
  operands with 1-3 spatial dimensions and no output sharding."""
  if compat.primitive_name(eqn) != _CONV or len(eqn.invars) != 2:
    return False
  lhs, rhs = (v.aval for v in eqn.invars)
  p = compat.eqn_params(eqn)
  return (3 <= len(lhs.shape) <= 5 and lhs.dtype == rhs.dtype and
          np.dtype(lhs.dtype) in _DTYPES and
          p.get("out_sharding") is None)


def _bind_all(closed: Any, args: Sequence[Any]) -> list[Any]:
  """``closed`` evaluated on ``args``, its applicable convolutions bound
  by :func:`canonical`."""
  invars, outvars = compat.jaxpr_io(closed)
  constvars, consts = compat.jaxpr_consts(closed)
  env = dict(zip(constvars + invars, consts + list(args)))
  read = lambda v: compat.literal_value(v) if compat.is_literal(v) else env[v]
  for eqn in compat.jaxpr_eqns(closed):
    ins = [read(v) for v in eqn.invars]
    outs = (canonical(*ins, eqn) if applies(eqn)
            else compat.bind_eqn(eqn, ins))
    env.update(zip(eqn.outvars, outs))
  return [read(v) for v in outvars]


def _sds(x: Any) -> jax.ShapeDtypeStruct:
  return jax.ShapeDtypeStruct(tuple(x.shape), x.dtype)


def conv(lhs: Any, rhs: Any, eqn: Any) -> Any:
  """The convolution ``eqn`` on ``lhs, rhs``, forward and backward in the
  canonical order."""

  @jax.custom_vjp
  def f(x, w):
    return canonical(x, w, eqn)[0]

  def fwd(x, w):
    return f(x, w), (x, w)

  def bwd(res, g):
    x, w = res
    pull = lambda x, w, g: jax.vjp(  # pylint: disable=unnecessary-lambda-assignment
        lambda a, b: compat.bind_eqn(eqn, [a, b])[0], x, w)[1](g)
    closed, _ = compat.make_jaxpr(pull, _sds(x), _sds(w), _sds(g))
    return tuple(_bind_all(closed, [x, w, g]))

  f.defvjp(fwd, bwd)
  return f(lhs, rhs)


def count(blocks: Sequence[Any]) -> int:
  """How many equations :func:`rewrite` would rebind in ``blocks``."""
  return sum(applies(e) for b in blocks for e in b.eqns)


#: Rewritten blocks by block: one rewrite per block object, so the kernel
#: sets of several plans over one partition share their convolutions'
#: functions (``passes.block_vjp``'s probes are keyed by the jaxpr's text,
#: which names them).
_REWRITTEN: "weakref.WeakKeyDictionary[Any, Any]" = weakref.WeakKeyDictionary()


def rewrite(block: Any) -> Any:
  """``block`` (a ``passes.partition.ForwardBlock``) with its top-level
  convolutions bound through :func:`conv`; the same object where it has
  none."""
  hit = _REWRITTEN.get(block)
  if hit is None:
    new = _rewrite(block)
    # The block itself is not stored as its own value (never freed).
    hit = _REWRITTEN[block] = False if new is block else new
  return block if hit is False else hit


def _rewrite(block: Any) -> Any:
  hits = {i for i, e in enumerate(block.eqns) if applies(e)}
  return block_rebind.rebind(block, hits,
                             lambda eqn, ins: [conv(*ins, eqn)])


__all__ = ["applies", "canonical", "canonical_specs", "conv", "count",
           "is_canonical", "rewrite"]


def patches_dot(lhs: Any, rhs: Any, eqn: Any) -> Any:
  """A canonical-order convolution ``eqn`` (no groups) as one dot: the
  input's padded, dilated taps side by side (im2col) times the kernel
  flattened to ``(taps * in, out)``."""
  p = compat.eqn_params(eqn)
  nsp = len(lhs.shape) - 2
  ld = p["lhs_dilation"] or (1,) * nsp
  rd = p["rhs_dilation"] or (1,) * nsp
  st = p["window_strides"]
  cfg = [(0, 0, 0)] + [(lo, hi, d - 1) for (lo, hi), d in
                       zip(p["padding"], ld)] + [(0, 0, 0)]
  xp = lax.pad(lhs, np.zeros((), lhs.dtype), cfg)
  taps = rhs.shape[:nsp]
  outs = [(xp.shape[1 + i] - (taps[i] - 1) * rd[i] - 1) // st[i] + 1
          for i in range(nsp)]
  cols = []
  for t in np.ndindex(*taps):
    start = (0,) + tuple(k * r for k, r in zip(t, rd)) + (0,)
    limit = ((xp.shape[0],) + tuple(s + (o - 1) * d + 1 for s, o, d in
                                    zip(start[1:], outs, st)) +
             (xp.shape[-1],))
    cols.append(lax.slice(xp, start, limit, (1,) + tuple(st) + (1,)))
  x = cols[0] if len(cols) == 1 else lax.concatenate(cols, nsp + 1)
  w = rhs.reshape((-1, rhs.shape[-1]))
  return lax.dot_general(x, w, (((nsp + 1,), (0,)), ((), ())),
                         precision=p.get("precision"),
                         preferred_element_type=p.get(
                             "preferred_element_type"))
