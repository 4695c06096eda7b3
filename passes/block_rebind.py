"""A forward block with some of its equations bound another way.

The kernel rewrites (``passes.row_dots``, ``passes.conv_forms``) keep a
block's inputs, constants and outputs and rebind a few of its top-level
equations (a dot with the weight read in place, a convolution in another
dimension order). :func:`rebind` re-traces the block with those equations
bound by the caller and returns the block with the new equations; the
constants the new equations capture join the block's constants.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Collection, Sequence
from typing import Any

from tessel_jax import compat


def rebind(block: Any, hits: Collection[int],
           bind: Callable[[Any, Sequence[Any]], Sequence[Any]]) -> Any:
  """``block`` (a ``passes.partition.ForwardBlock``) with its equations at
  the indices ``hits`` bound by ``bind(eqn, inputs)`` (their outputs);
  the same object where ``hits`` is empty."""
  if not hits:
    return block
  closed = compat.closed_from_eqns(
      block.eqns, list(block.invars) + list(block.const_vars), block.outvars)
  new = compat.retrace(
      closed, lambda i, eqn, ins: list(bind(eqn, ins)) if i in hits else None)
  invars, outvars = compat.jaxpr_io(new)
  consts_v, consts = compat.jaxpr_consts(new)
  n = len(block.invars)
  return dataclasses.replace(
      block, eqns=tuple(compat.jaxpr_eqns(new)), invars=tuple(invars[:n]),
      const_vars=tuple(invars[n:]) + tuple(consts_v),
      const_vals=tuple(block.const_vals) + tuple(consts),
      outvars=tuple(outvars))


__all__ = ["rebind"]
