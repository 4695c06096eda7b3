"""Stash writes ordered after the reads before them (no whole-stash copies).

XLA's CPU pipeline inserts copies before it schedules, knowing only data
dependences: when a tick reads the stash (inside its switch) and a later
tick of the same run writes into it a value that does not depend on that
read (another kernel's output, a message), XLA cannot prove the read comes
first and copies the whole stash, twice per loop iteration (measured: two
12 MiB copies per period of the 2-stage MLP of ``experiments.peer_bench``,
2026-11-25). ``lax.optimization_barrier`` does not help: XLA's CPU pipeline
removes it before copy insertion.

:class:`Order` makes the dependence explicit: every tick that read the stash
adds a scalar taken from its outputs to a token, and every later write's
slot index is ``where(device < 0, token, slot)``; the device index is never
negative, so the slot is unchanged, but XLA cannot fold the select and must
run the write after the reads. Cost: a few scalar ops per tick.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import jax.numpy as jnp


def _scalar(v: Any) -> Any:
  """An int32 scalar that depends on ``v``: its first element, indexed
  (``ravel`` of a value split over a GSPMD axis made XLA gather it whole)."""
  return (v[(0,) * v.ndim] != 0).astype(jnp.int32)


class Order:
  """Token of the stash reads of one straight run, bound to a device index.

  Args:
    dev: The device's index on the pipe axis (traced).
  """

  def __init__(self, dev: Any):
    self._guard = dev < 0
    self._token: Any = None

  @property
  def token(self) -> Any:
    """The token so far (an int32 scalar; 0 when nothing was recorded)."""
    return jnp.int32(0) if self._token is None else self._token

  def add(self, token: Any) -> None:
    """Later writes follow whatever computed the int32 scalar ``token``."""
    self._token = token if self._token is None else self._token + token

  def follow(self, token: Any) -> None:
    """Like :meth:`add` for a ``token`` computed after the current one
    (the final counter of a while loop whose trip count is
    :meth:`slot` of a value): it stands for both, so it replaces the token
    instead of being added to it (one scalar add, an XLA kernel of its own,
    fewer per loop)."""
    self._token = token

  def after(self, values: Sequence[Any]) -> None:
    """Later writes follow the computation of every one of ``values``."""
    for v in values:
      if getattr(v, "size", 0):
        self.add(_scalar(v))

  def slot(self, slot: Any) -> Any:
    """``slot``, made dependent on every read recorded so far."""
    if self._token is None:
      return slot
    return jnp.where(self._guard, self._token, slot)


__all__ = ["Order"]
