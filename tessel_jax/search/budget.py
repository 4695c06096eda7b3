"""The time budget of one search, in CP-SAT's deterministic seconds."""

from __future__ import annotations

import time


class Budget:
  """Solver time budget counted in CP-SAT's deterministic time.

  Deterministic time makes the same input and seed give the same schedule
  even when solves are cut by the limit (wall time would not).
  """

  def __init__(self, total: float, completion_s: float | None = None):
    """``completion_s``: deterministic seconds of each completion solve of
    an ``N`` below the templates (``compose.with_templates``; None: the
    default there)."""
    self.total = total
    self.completion_s = completion_s
    self.used = 0.0
    # Safety net on a loaded machine (deterministic time can run slower
    # than the wall clock): never more than twice the budget in wall time.
    self.wall_deadline = time.perf_counter() + 2 * total

  def spend(self, work: float) -> None:
    self.used += work

  def left(self, share: float = 1.0) -> float:
    """Time for the next solve: ``share`` of the total, at most what is left."""
    return max(0.05, min(self.total * share, self.total - self.used))

  def wall_left(self) -> float:
    """Wall-clock seconds left before the cap (at least 0.05, so the
    polish after the period search still runs)."""
    return max(0.05, self.wall_deadline - time.perf_counter())

  def past_wall_cap(self) -> bool:
    return time.perf_counter() >= self.wall_deadline

  def spent(self) -> bool:
    return self.used >= self.total or self.past_wall_cap()
