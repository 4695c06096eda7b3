"""The time budget of one search, in CP-SAT's deterministic seconds."""

from __future__ import annotations

from tessel_jax.search import clock


class Budget:
  """Solver time budget counted in CP-SAT's deterministic time.

  Deterministic time makes the same input and seed give the same schedule
  even when solves are cut by the limit (wall time would not). The safety
  net on the whole search (deterministic time can run slower than the
  clock) is in CPU seconds of the searching thread (``clock.now``), so
  other jobs on the machine do not move it.
  """

  def __init__(self, total: float, completion_s: float | None = None):
    """``completion_s``: deterministic seconds of each completion solve of
    an ``N`` below the templates (``compose.with_templates``; None: the
    default there)."""
    self.total = total
    self.completion_s = completion_s
    self.used = 0.0
    # Never more than twice the budget in CPU seconds (the net was wall
    # seconds, which a loaded machine spends before the search's work).
    self.cap_deadline = clock.now() + 2 * total
    self._cuts_before = clock.cuts()
    self._capped = False

  def spend(self, work: float) -> None:
    self.used += work

  def left(self, share: float = 1.0) -> float:
    """Time for the next solve: ``share`` of the total, at most what is left."""
    return max(0.05, min(self.total * share, self.total - self.used))

  def cap_left(self) -> float:
    """CPU seconds left before the cap (at least 0.05, so the polish after
    the period search still runs)."""
    return max(0.05, self.cap_deadline - clock.now())

  def past_cap(self) -> bool:
    if clock.now() >= self.cap_deadline:
      self._capped = True
    return self._capped

  def spent(self) -> bool:
    return self.used >= self.total or self.past_cap()

  def note_clock(self) -> None:
    """Records that the CPU clock, not only the budget, decided a step
    (``polish.polish_budget`` shortened by the cap)."""
    self._capped = True

  def cut_by_clock(self) -> bool:
    """Whether a safety net (this cap, or a solve's: ``clock.CappedSolver``)
    has cut this search or the CPU clock shortened a step of it: then its
    result depends on the CPU clock, not only on its model and seed
    (conservative: True once the search's CPU seconds reach the cap)."""
    return self.past_cap() or clock.cuts() > self._cuts_before
