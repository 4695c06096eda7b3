"""Kernels a profile compiles ahead of timing them (``measure``).

Taking a kernel not compiled yet compiles it with the next ones the profile
will measure: one program of several (``cost.grouped``, on by default) or
each its own on the compile threads (``compile_pool``), as many as the
lookahead allows. While a caller's bound may stop the profile, fewer are
compiled ahead, so a stopped plan has not compiled kernels it never times.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from tessel_jax.cost import compile_pool as _compile_pool
from tessel_jax.cost import fused_grads as _fused_grads
from tessel_jax.cost import grouped as _grouped


#: ``TESSEL_JAX_BOUND_LOOKAHEAD=1``: while a caller's bound may stop a
#: profile (``before_measure``), kernels are compiled one per compile
#: thread at a time instead of ``compile_pool.AHEAD`` ahead (off by
#: default: not measured quietly; see :func:`room_under_bound`).
BOUND_LOOKAHEAD_ENV = "TESSEL_JAX_BOUND_LOOKAHEAD"


def room_under_bound(before_measure: Any) -> int | None:
  """Kernels compiled ahead with the one taken while a caller's bound may
  stop the profile: with :data:`BOUND_LOOKAHEAD_ENV` set to 1, one per
  compile thread (``compile_pool.WORKERS - 1`` more), so a plan stopped
  after its k-th kernel has compiled at most ``WORKERS - 1`` kernels it
  does not time (``compile_pool.AHEAD`` ahead: up to ``AHEAD - 1``;
  README GPT, interleaved pipe2 x dp2 stopped before its 8th kernel had
  compiled all 8); None (the default lookahead) otherwise."""
  if before_measure is None or os.environ.get(BOUND_LOOKAHEAD_ENV,
                                              "0") != "1":
    return None
  return max(0, _compile_pool.WORKERS - 1)



class Ahead:
  """``measure.profile_kernels``' kernels compiled ahead: taking a key not
  compiled yet compiles it with the next ones it will measure
  (:func:`next_to_measure`), up to ``compile_pool.WORKERS`` (compile
  threads) or ``compile_pool.AHEAD`` (kernels compiled before the first is
  timed) at a time."""

  def __init__(self, keys: Mapping[int, str], ks: Any,
               by_key: Mapping[str, Any], on_disk: Mapping[str, Any],
               param_avals: Sequence[Any], device: Any, estimator: Any,
               stage: Any, lower: Callable[..., Any],
               hoisted: frozenset[int] = frozenset(),
               room: int | None = None, bounded: bool = False):
    self._pool = _compile_pool.Prefetch()
    self._room = room  # _next_to_measure's (None: its default)
    self._bounded = bounded  # a caller's bound may stop the profile
    self._keys, self._by_key, self._on_disk = keys, by_key, on_disk
    self._kernel_of = {key: ks.kernels[bid] for bid, key in keys.items()}
    self._hoist = {key: bid in hoisted for bid, key in keys.items()}
    self._avals, self._device = param_avals, device
    self._estimator, self._stage = estimator, stage
    self._lower = lower  # measure.lower_kernel

  def take(self, key: str) -> _compile_pool.Prepared | None:
    """``key``'s kernel, compiled (with the next ones if it was not)."""
    prepared = (self._pool.take(key) or
                _compile_pool.BACKGROUND.take(key))
    if prepared is None and self._grouped(key):
      prepared = self._pool.take(key)
    if prepared is None:
      self._pool.compile(
          [key] + next_to_measure(key, self._keys, self._by_key,
                                   self._on_disk, self._estimator,
                                   self._stage, room=self._room),
          lambda kk: self._lower(self._kernel_of[kk], self._avals,
                                  self._device, stage=self._stage,
                                  hoist=self._hoist[kk]))
      prepared = self._pool.take(key)
    return prepared

  def _group_room(self) -> int:
    """Kernels grouped with the one taken: up to ``grouped.MAX_KERNELS``,
    but while a caller's bound may stop the profile (``before_measure``)
    no more than the one-by-one path compiles ahead (``next_to_measure``'s
    room), so a plan the bound stops has not compiled every kernel."""
    if not self._bounded:
      return _grouped.MAX_KERNELS - 1
    if self._room is not None:
      return self._room
    return max(_compile_pool.WORKERS, _compile_pool.AHEAD) - 1

  def _grouped(self, key: str) -> bool:
    """With ``cost.grouped`` on: compiles ``key``'s kernel and the next
    ones it will measure (up to ``grouped.MAX_KERNELS``) as one program,
    ready in the pool; False when there is no group to compile (fewer
    than two, on a stage, or with fused gradients)."""
    if not _grouped.enabled() or self._stage is not None:
      return False
    keys = [kk for kk in [key] + next_to_measure(
        key, self._keys, self._by_key, self._on_disk, self._estimator,
        self._stage, room=self._group_room())
            if not _fused_grads.applies(self._kernel_of[kk])]
    if len(keys) < 2 or keys[0] != key:
      return False
    done = _grouped.compile_group([self._kernel_of[kk] for kk in keys],
                                  self._avals, self._device,
                                  [self._hoist[kk] for kk in keys])
    self._pool.put(dict(zip(keys, done)))
    return True


def next_to_measure(key: str, keys: Mapping[int, str],
                     by_key: Mapping[str, Any], on_disk: Mapping[str, Any],
                     estimator: Any, stage: Any,
                     room: int | None = None) -> list[str]:
  """Keys after ``key`` (in ``keys``' order) that ``measure.profile_kernels``
  will compile and time too: neither measured nor on disk (``on_disk``,
  read once by :func:`_disk_records`), and (with an ``estimator``) before
  it has enough measured kernels to estimate them; at most
  ``room`` (default ``max(compile_pool.WORKERS, compile_pool.AHEAD) -
  1``), compiled with ``key``'s kernel."""
  if room is None:
    room = max(_compile_pool.WORKERS, _compile_pool.AHEAD) - 1
  if estimator is not None and stage is None:
    room = min(room, estimator.still_to_measure(by_key.values()) - 1)
  order = list(dict.fromkeys(keys.values()))
  out: list[str] = []
  for kk in order[order.index(key) + 1:]:
    if len(out) >= room:
      break
    if (kk not in by_key and kk not in on_disk and
        not _compile_pool.BACKGROUND.has(kk)):
      out.append(kk)
  return out
