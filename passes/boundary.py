"""``boundary``: the user-facing block marker."""

from __future__ import annotations

from typing import Any

import jax

from tessel_jax import compat


def boundary(*xs: Any) -> Any:
  """Marks the end of a block; returns its arguments unchanged.

  An identity primitive (``tessel_boundary``) that survives tracing, jit, vmap
  and grad; ``tessel_jax.schedule`` cuts the traced function at every
  boundary, numbering the blocks in program order. Arguments may be arrays or
  pytrees of arrays.

  Args:
    *xs: Values that cross into the next block (at least one array).

  Returns:
    ``xs[0]`` for one argument, else the tuple ``xs``, unchanged.

  Raises:
    TypeError: if no array is passed.
  """
  leaves, tree = jax.tree_util.tree_flatten(xs)
  if not leaves:
    raise TypeError(
        "tj.boundary needs at least one array (the values that cross into"
        " the next block), e.g. h = tj.boundary(h)")
  out = jax.tree_util.tree_unflatten(tree, compat.bind_boundary(*leaves))
  return out[0] if len(xs) == 1 else out
