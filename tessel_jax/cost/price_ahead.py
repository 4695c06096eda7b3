"""The programs a measured build's first price times, compiled while it
searches on.

The first schedule a process prices (``schedule_choice.choose``) measures
the lowering's per-tick costs (``cost.ticks``: two toy tick programs) and
the packing around the ticks (``cost.outside``), each compiled and then
timed; on the README main job ~1 s of XLA compile, after which the build
went on searching and building tick plans (CP-SAT and Python: one core).
:func:`start` hands those compiles to the background compile thread
(``compile_pool.BACKGROUND``) before the build searches its other
candidates, so they run on the other core; the timings stay where they
were, with no compile in flight (every timing drains the thread first).
What the cache already answers is not compiled. ``TESSEL_JAX_PRICE_AHEAD=0``
turns it off.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

from tessel_jax.cost import compile_pool as _compile_pool
from tessel_jax.cost import outside as _outside
from tessel_jax.cost import processes as _processes
from tessel_jax.cost import ticks as _ticks

#: ``0`` turns the compiles ahead off; ``1`` (default) on.
ENV = "TESSEL_JAX_PRICE_AHEAD"


def enabled() -> bool:
  """Whether :func:`start` compiles anything (:data:`ENV`)."""
  value = os.environ.get(ENV, "1")
  if value not in ("0", "1"):
    raise ValueError(f"{ENV} must be 0 or 1, got {value!r}")
  return value == "1"


def start(model: Any, layout: Any, mesh: Any, pipe_axis: str) -> list[str]:
  """Compiles, on the background thread, what ``model``'s first price on
  ``layout`` will time and no cache answers: the tick microbenchmark's
  programs and ``layout``'s outside program (where the build installed
  its timer). Returns the keys handed over, for :func:`finish`."""
  if (not enabled() or getattr(mesh, "devices", None) is None or
      not _processes.single_process()):
    return []
  local = _processes.local_mesh(mesh, pipe_axis)
  fields = _processes.mesh_fields(local, pipe_axis)
  keys = []
  if model.memo.ticks is None and not model.cache.has(
      "ticks", _ticks.tick_cache_key(fields)):
    keys += _ticks.prefetch_tick_programs(local, pipe_axis)
  timer = None if model.time_outside is None else model.time_outside(layout)
  if isinstance(timer, _outside.OutsideTimer) and not model.cache.has(
      "outside", _outside.outside_cache_key(fields, timer.signature)):
    keys.append(timer.prefetch())
  return keys


def finish(keys: Sequence[str]) -> None:
  """Drops what :func:`start` compiled and no price took (a build that
  stopped before pricing, a figure found in the cache meanwhile)."""
  _compile_pool.BACKGROUND.discard(keys)

