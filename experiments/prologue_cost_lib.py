"""What a device's per-step prologue costs the step (no flags here).

Every device of the one SPMD program zero-fills every accumulator of every
slot class, also the slots it holds no leaf of (``idle_slot_bytes``: on
ResNet18's vshape(2) device 0 fills, carries and outputs device 1's 44 MB
of gradient classes). Whether removing such work from one device would
shorten the step depends on whether that device's prologue is on the
critical path. :func:`extra_passes` answers it by adding work there: on ONE
device every zero fill of at least ``min_bytes`` is written, then read and
written again ``passes - 1`` more times (under one ``lax.cond`` on the
device index, so the other device runs a plain fill), exactly zero, so the
gradients do not change. The paired step ratio against a control with the
same ``cond`` but no extra work is the step's sensitivity to that device's
prologue (``experiments.prologue_cost``).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from typing import Any

import jax.numpy as jnp
import numpy as np
from jax import lax

from tessel_jax.passes import zero_fill


def idle_slot_bytes(layout: Any) -> tuple[int, ...]:
  """Per device, the bytes of the slot arrays that hold no leaf there
  (filled, carried and output as zeros every step by that device)."""
  out = [0] * layout.num_devices
  for c in layout.classes:
    for d, row in enumerate(c.assign):
      out[d] += sum(c.device_nbytes for leaf in row if leaf < 0)
  return tuple(out)


def _fill(seed: Any, shape: Sequence[int], dtype: Any, passes: Any) -> Any:
  """A zero array of ``shape`` from the scalar ``seed * 0``, then read and
  written ``passes - 1`` more times by a loop whose trip count is a traced
  value (XLA neither unrolls it nor fuses its passes: each is a read and a
  write of the loop carry)."""
  s = seed * np.float32(0)
  z = lax.broadcast_in_dim(s.astype(dtype), tuple(shape), ())
  return lax.fori_loop(0, passes - 1, lambda _, z: z * s.astype(dtype), z)


@contextlib.contextmanager
def extra_passes(device: int | None, passes: int = 3,
                 min_bytes: int = 1 << 20) -> Iterator[None]:
  """While active, lowered programs fill every floating zero array of at
  least ``min_bytes`` through ``lax.cond(dev == device, heavy, plain)``:
  ``heavy`` writes it ``passes`` times (:func:`_fill`), ``plain`` once.
  ``device=None``: no fill changes; ``device=-1``: the ``cond`` with the
  plain fill on every device (the control)."""
  plain_zeros = zero_fill.Fills.zeros
  count = [0]

  def zeros(self: Any, shape: Sequence[int], dtype: Any) -> Any:
    nbytes = int(np.prod(shape, dtype=np.int64)) * np.dtype(dtype).itemsize
    if nbytes < min_bytes or not jnp.issubdtype(dtype, jnp.floating):
      return plain_zeros(self, shape, dtype)
    count[0] += 1  # a scalar of its own: XLA merges no two fills or conds
    dev = self._dev  # pylint: disable=protected-access
    seed = lax.convert_element_type(dev, np.float32) + np.float32(count[0])
    trips = dev * 0 + passes  # traced: the loop is not unrolled
    return lax.cond(dev == device,
                    lambda: _fill(seed, shape, dtype, trips),
                    lambda: _fill(seed, shape, dtype, 1))

  if device is None:
    yield
    return
  zero_fill.Fills.zeros = zeros
  try:
    yield
  finally:
    zero_fill.Fills.zeros = plain_zeros
