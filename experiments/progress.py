"""Progress lines with an ETA for the runners' long loops."""

from __future__ import annotations

import time


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
