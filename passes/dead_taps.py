"""Convolution taps that only ever read padding, sliced off the kernel.

A 3x3 ``"SAME"`` convolution on a 1x1 feature map (ResNet18's last stage
at 16x16 images) multiplies 8 of its 9 kernel taps by padding only, yet
XLA:CPU reads the whole kernel in the forward and writes (and adds) the
whole weight gradient in the backward. :func:`rewrite` re-traces the
step's top-level ``conv_general_dilated`` equations whose spatial taps are
partly dead: the kernel (right operand) is sliced to its live taps and the
padding shrunk to match, which gives the same output exactly (the dropped
taps only ever met padding). The sliced weight is parameter-only work
(``passes.hoist`` computes it once before the ticks); its gradient is the
live taps' gradient padded with zeros.

Only undilated spatial dimensions are sliced; convolutions inside
control flow or calls are left as they are.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from jax import lax

from tessel_jax import compat

_CONV = "conv_general_dilated"


def live_taps(size: int, taps: int, stride: int, lo: int, hi: int
              ) -> tuple[int, int] | None:
  """``(first, last)`` kernel taps (inclusive) that read some input element
  of a spatial dimension of ``size`` elements, padded ``(lo, hi)``; None
  where no output exists or no tap is live."""
  outputs = (size + lo + hi - taps) // stride + 1
  if outputs <= 0:
    return None
  live = [t for t in range(taps)
          if any(0 <= o * stride + t - lo < size for o in range(outputs))]
  return (live[0], live[-1]) if live else None


def plan(eqn: Any) -> tuple[tuple[int, int, int], ...] | None:
  """``((rhs dim, first, last), ...)`` for a convolution equation with dead
  taps in some spatial dimension; None where every tap is live (or the
  equation is not a convolution)."""
  if compat.primitive_name(eqn) != _CONV:
    return None
  p = compat.eqn_params(eqn)
  lhs_spec, rhs_spec, _ = p["dimension_numbers"]
  lhs, rhs = (v.aval.shape for v in eqn.invars[:2])
  cuts = []
  for i, (lo, hi) in enumerate(p["padding"]):
    if p["lhs_dilation"][i] != 1 or p["rhs_dilation"][i] != 1:
      continue
    dim, taps = rhs_spec[2 + i], rhs[rhs_spec[2 + i]]
    live = live_taps(lhs[lhs_spec[2 + i]], taps, p["window_strides"][i],
                     lo, hi)
    if live is not None and live != (0, taps - 1):
      cuts.append((dim,) + live)
  return tuple(cuts) or None


def _bind(eqn: Any, ins: Sequence[Any],
          cuts: tuple[tuple[int, int, int], ...]) -> list[Any]:
  """``eqn`` bound on its kernel sliced by ``cuts``, padding shrunk."""
  p = compat.eqn_params(eqn)
  _, rhs_spec, _ = p["dimension_numbers"]
  lhs, rhs = ins[0], ins[1]
  padding = [tuple(x) for x in p["padding"]]
  for dim, first, last in cuts:
    i = list(rhs_spec[2:]).index(dim)
    taps = rhs.shape[dim]
    rhs = lax.slice_in_dim(rhs, first, last + 1, axis=dim)
    lo, hi = padding[i]
    padding[i] = (lo - first, hi - (taps - 1 - last))
  return compat.bind_eqn(eqn, [lhs, rhs, *ins[2:]], padding=tuple(padding))


def rewrite(closed: Any) -> Any:
  """``closed`` with its top-level convolutions' dead taps sliced off (the
  same jaxpr object where none has any)."""
  cuts = {i: c for i, e in enumerate(compat.jaxpr_eqns(closed))
          if (c := plan(e)) is not None}
  if not cuts:
    return closed
  return compat.retrace(
      closed, lambda i, eqn, ins: _bind(eqn, ins, cuts[i]) if i in cuts
      else None)


__all__ = ["live_taps", "plan", "rewrite"]
