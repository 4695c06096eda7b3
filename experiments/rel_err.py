"""The experiments' one relative-error figure: :func:`max_rel`.

Largest ``max|a - b| / max|b|`` over the leaves of two trees, in float64
(``tessel_jax.verify.rel_err``; inf where a leaf's shape differs). jax is
imported on the first call, not with this module: runners set their XLA
flags (``experiments.xla_env``) before jax loads.

``model_zoo_lib.max_rel_err`` is another figure (a floor under vanishing
reference leaves), not this one.
"""

from __future__ import annotations

from typing import Any


def max_rel(got: Any, want: Any) -> float:
  """Largest ``max|a - b| / max|b|`` over the leaves of ``got`` and
  ``want`` (two trees of the same structure, or two arrays); 0.0 for
  empty trees.

  Raises:
    ValueError: the trees have a different number of leaves.
  """
  import jax  # pylint: disable=import-outside-toplevel
  from tessel_jax import verify  # pylint: disable=import-outside-toplevel
  a = jax.tree_util.tree_leaves(got)
  b = jax.tree_util.tree_leaves(want)
  if len(a) != len(b):
    raise ValueError(f"max_rel compares trees of {len(a)} and {len(b)}"
                     f" leaves; pass the two results of the same function")
  return max((verify.rel_err(x, y)[1] for x, y in zip(a, b)), default=0.0)
