"""The errors of the schedule search."""

from __future__ import annotations


class InfeasibleScheduleError(ValueError):
  """No schedule of the placement fits under the memory limit.

  Attributes:
    min_memory_limit: The smallest per-device limit for which a schedule
      exists (None if the solver could not determine it in time).
  """

  def __init__(self, message: str, min_memory_limit: int | None):
    super().__init__(message)
    self.min_memory_limit = min_memory_limit


class SearchTimeoutError(RuntimeError):
  """CP-SAT found no schedule within the time limit (none proven impossible)."""
