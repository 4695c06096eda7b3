"""Trace-time pieces every part of the lowering shares (``passes.lower``).

``Ctx`` binds one device index (and, in an interpreted segment, a tick) and
turns the plan's numpy tables into per-device values; ``SCOPES`` names the
parts of a tick in the HLO's ``op_name`` metadata (``scoped``);
``read_rows`` / ``read`` / ``write`` are the stash's slice reads and writes.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from . import indexing as _indexing
from .plan import Dyn

NO_MOD = 1 << 30
# ``pbuf`` key of the parameter leaves read in place (``inplace_params``).
INPLACE = ("inplace",)

# Name scopes of the program's parts: they reach the HLO's op_name metadata,
# where ``experiments.step_profile`` reads them to split a profiled step.
SCOPES = {"kernel": "tj_kernel", "params": "tj_params",
          "stash_read": "tj_stash_read", "stash_write": "tj_stash_write",
          "send": "tj_send", "ppermute": "tj_ppermute",
          "accumulate": "tj_accumulate", "terminals": "tj_terminals"}
# Scopes of the segment kinds (``passes.segments``) and the prefix of each
# kernel's own scope (``tj_kernel/k<id>``): ``experiments.hlo_breakdown``
# reads them to split the HLO by segment kind and count kernel copies.
SEGMENT_SCOPES = {"ticks": "tj_seg_ticks", "loop": "tj_seg_loop",
                  "interp": "tj_seg_interp"}
KERNEL_PREFIX = "k"


def scoped(part: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
  """Runs a function under the name scope of ``part`` (see ``SCOPES``)."""
  def wrap(fn: Callable[..., Any]) -> Callable[..., Any]:
    def run(*args: Any, **kwargs: Any) -> Any:
      with jax.named_scope(SCOPES[part]):
        return fn(*args, **kwargs)
    run.__doc__, run.__name__ = fn.__doc__, fn.__name__
    return run
  return wrap


class Ctx:
  """Trace-time helpers bound to one device index (and an interp tick).

  Args:
    dev: The device's index on the pipe axis (traced).
    tau: The tick of an interpreted segment (int or traced), else None.
  """

  def __init__(self, dev: Any, tau: Any = None):
    self.dev = dev
    self.tau = tau

  def at(self, tau: Any) -> "Ctx":
    """The same device at interpreted tick ``tau``."""
    return Ctx(self.dev, tau)

  def table(self, values: np.ndarray, dtype: Any = jnp.int32) -> Any:
    """Per-device value: a Python scalar when uniform, else a lookup.

    1-D tables are indexed by device; 2-D (interp) tables by (tick, device).
    """
    values = np.asarray(values)
    if values.ndim == 2 and isinstance(self.tau, (int, np.integer)):
      values = values[int(self.tau)]
    if values.size and np.all(values == values.flat[0]):
      v = values.flat[0]
      return v.item() if hasattr(v, "item") else v
    if values.ndim == 2:
      return _indexing.lookup(values, (self.tau, self.dev), dtype)
    return _indexing.lookup(values, (self.dev,), dtype)

  def dyn(self, d: Dyn, it: Any) -> Any:
    """Evaluates a :class:`Dyn` for iteration ``it`` (int or traced)."""
    if isinstance(it, (int, np.integer)) or d.is_static:
      return self.table(d.at(int(it) if isinstance(it, (int, np.integer))
                             else 0))
    mod = np.where(d.mod > 0, d.mod, NO_MOD)
    base, scale = self.table(d.base), self.table(d.scale)
    c, m = self.table(d.c), self.table(mod)
    k = it + c
    if not (isinstance(m, int) and m == NO_MOD):
      k = k % m
    return base + scale * k


def read_rows(x: Any, start: Any, rows: int) -> Any:
  """``rows`` rows of ``x`` from ``start`` (``x`` itself when that is all)."""
  if isinstance(start, int) and start == 0 and x.shape[0] == rows:
    return x
  return _indexing.slice_in_dim(x, start, rows)


def write(pool: Any, value: Any, slot: Any, row: Any) -> Any:
  """``pool`` with ``value`` written at ``slot`` (from ``row`` if rowed)."""
  if value.shape == pool.shape[1:]:
    return _indexing.update_index(pool, value, slot)
  starts = (slot, row) + (0,) * (value.ndim - 1)
  return _indexing.dynamic_update_slice(pool, value[None], starts)


def read(pool: Any, slot: Any, row: Any, shape: tuple[int, ...]) -> Any:
  """The value of ``shape`` at ``slot`` (from ``row``) of ``pool``."""
  if tuple(shape) == pool.shape[1:]:
    return _indexing.index(pool, slot)
  starts = (slot, row) + (0,) * (len(shape) - 1)
  return _indexing.dynamic_slice(pool, starts, (1,) + tuple(shape))[0]
