"""Progress lines with an ETA for the runners' long loops."""

from __future__ import annotations

import threading
import time
from typing import Any, Callable


def _duration(seconds: float) -> str:
  seconds = max(0, round(seconds))
  if seconds < 60:
    return f"{seconds} s"
  if seconds < 3600:
    return f"{seconds // 60} min {seconds % 60:02d} s"
  return f"{seconds // 3600} h {seconds % 3600 // 60:02d} min"


class Eta:
  """Counts units of work and estimates the time left from the mean so far.

  Attributes:
    total: Units of work in the loop.
    done: Units finished so far.
  """

  def __init__(self, total: int):
    self.total = max(1, total)
    self.done = 0
    self._t0 = time.perf_counter()

  def elapsed(self) -> float:
    return time.perf_counter() - self._t0

  def finished(self, label: str) -> str:
    """``"3/22 <label> (about 40 s left)"``; counts one unit as done."""
    self.done = min(self.done + 1, self.total)
    left = self.elapsed() / self.done * (self.total - self.done)
    return f"{self.done}/{self.total} {label} (about {_duration(left)} left)"

  def skip(self) -> None:
    """Counts one unit that did no work (skipped)."""
    self.total = max(1, self.total - 1)

  def line(self, label: str) -> str:
    """``"3/22 <label> (1 min 02 s so far, about 40 s left)"``.

    Call when starting a unit (before its slow part); counts it as begun.
    """
    elapsed = self.elapsed()
    if self.done:
      left = f"about {_duration(elapsed / self.done * (self.total - self.done))} left"
    else:
      left = "time left unknown yet"
    self.done += 1
    return (f"{self.done}/{self.total} {label} ({_duration(elapsed)} so far,"
            f" {left})")


class Heartbeat:
  """Logs a line every ``every`` seconds while a slow call runs.

  A context manager for calls that report nothing themselves (XLA compiling
  a program, the first run of a step), so a person watching never waits
  more than ``every`` seconds without a line.

  Example::

    with Heartbeat("compiling the pipelined step", log):
      compiled = step.lower(params, batch).compile()
  """

  def __init__(self, what: str, log: Callable[[str], None],
               every: float = 4.0):
    self.what = what
    self.log = log
    self.every = every
    self._stop = threading.Event()
    self._thread = threading.Thread(target=self._run, daemon=True)
    self._t0 = 0.0

  def _run(self) -> None:
    while not self._stop.wait(self.every):
      self.log(f"  ... {self.what}: {time.perf_counter() - self._t0:.0f} s"
               f" so far")

  def __enter__(self) -> "Heartbeat":
    self._t0 = time.perf_counter()
    self._thread.start()
    return self

  def __exit__(self, *exc: Any) -> None:
    self._stop.set()
    self._thread.join()
