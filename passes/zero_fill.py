"""Zero-filled loop carries, each written by a fill of its own.

The step's accumulators and stash pools start as zeros and are carried
through the segments' loops. XLA merges equal ``broadcast(0)`` values into
one (CSE), and a loop carrying that value several times then copies the one
fill into every other carry (``copy(wrapped_broadcast)``): a copy reads and
writes the buffer where a fill only writes it (ResNet18's placed step: three
3x3x512x512 accumulators per device, one fill and two 9.4 MB copies).
:class:`Fills` makes every floating fill from a scalar XLA cannot prove equal
to another's (``(float(dev) + k) * 0``: exactly ``+0``, the device index is a
small non-negative integer), so each carry is filled in place. The first
fill of each shape and dtype stays ``jnp.zeros`` (nothing to merge it with
yet: the distinct scalar costs a fused computation of HLO), and so do
integer and boolean zeros (XLA folds ``x * 0`` there).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import jax.numpy as jnp
import numpy as np
from jax import lax


class Fills:
  """Zero arrays, each floating one from its own scalar (``distinct``).

  Args:
    dev: The device's index on the pipe axis (traced int).
    distinct: ``Switches.distinct_fills``; off: ``jnp.zeros`` throughout.
  """

  def __init__(self, dev: Any, distinct: bool = True):
    self._dev = dev
    self._distinct = distinct
    self._count = 0
    self._seen: set[tuple] = set()

  def zeros(self, shape: Sequence[int], dtype: Any) -> Any:
    """A zero array of ``shape`` and ``dtype``."""
    dtype = np.dtype(dtype)
    key = (tuple(shape), dtype)
    if (not (self._distinct and jnp.issubdtype(dtype, jnp.floating))
        or key not in self._seen):
      self._seen.add(key)
      return jnp.zeros(tuple(shape), dtype)
    self._count += 1
    seed = lax.convert_element_type(self._dev, np.float32) + np.float32(
        self._count)
    scalar = lax.convert_element_type(seed * np.float32(0), dtype)
    return lax.broadcast_in_dim(scalar, tuple(shape), ())
