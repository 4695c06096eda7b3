"""Progress lines of ``tj.schedule``'s first call, on the ``tessel_jax`` logger.

One INFO line per phase with its wall time (trace, cut, kernels, profile,
search, lower, compile). The logger has no handler of its own, so library
use stays quiet (Python shows only warnings by default); an application
that logs at INFO (e.g. absl's ``logging.set_verbosity(logging.INFO)``, or
``logging.basicConfig(level=logging.INFO)``) shows them, and
``tj.schedule(..., verbose=True)`` turns them on for stderr
(:func:`enable`).
"""

from __future__ import annotations

import logging
import sys
import time
from typing import Any

import jax

LOGGER = logging.getLogger("tessel_jax")

# jax.monitoring events of one jit compilation (jax/_src/dispatch.py names).
_JAX_EVENTS = {"/jax/core/compile/jaxpr_trace_duration": "trace",
               "/jax/core/compile/jaxpr_to_mlir_module_duration": "to MLIR",
               "/jax/core/compile/backend_compile_duration": "XLA compile"}


def enable() -> None:
  """Shows the progress lines on stderr (once; the logger level to INFO)."""
  if not any(getattr(h, "_tessel_jax", False) for h in LOGGER.handlers):
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(name)s: %(message)s"))
    handler._tessel_jax = True  # pylint: disable=protected-access
    LOGGER.addHandler(handler)
  if LOGGER.getEffectiveLevel() > logging.INFO:
    LOGGER.setLevel(logging.INFO)


class Clock:
  """Logs the time of each phase of one build of ``fn_name``."""

  def __init__(self, fn_name: str):
    self.fn_name = fn_name
    self.start = self.last = time.perf_counter()

  def lap(self, phase: str, note: str = "") -> float:
    """Logs ``phase`` with the seconds since the previous lap."""
    now = time.perf_counter()
    seconds, self.last = now - self.last, now
    LOGGER.info("schedule(%r): %s %.2f s%s", self.fn_name, phase, seconds,
                f" ({note})" if note else "")
    return seconds

  def total(self, what: str) -> None:
    LOGGER.info("schedule(%r): %s in %.2f s", self.fn_name, what,
                time.perf_counter() - self.start)


class CompileTimes:
  """Context manager: jax's trace / lowering / XLA compile seconds inside it.

  Listens to ``jax.monitoring`` duration events while active.
  """

  def __init__(self) -> None:
    self.seconds = {name: 0.0 for name in _JAX_EVENTS.values()}

  def _listen(self, event: str, duration: float, **kwargs: Any) -> None:
    del kwargs
    name = _JAX_EVENTS.get(event)
    if name is not None:
      self.seconds[name] += duration

  def __enter__(self) -> "CompileTimes":
    jax.monitoring.register_event_duration_secs_listener(self._listen)
    return self

  def __exit__(self, *exc: Any) -> None:
    jax.monitoring.unregister_event_duration_listener(self._listen)

  def note(self) -> str:
    return ", ".join(f"{k} {v:.2f} s" for k, v in self.seconds.items())
