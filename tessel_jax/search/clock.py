"""The search's safety nets, in CPU seconds of the searching thread.

CP-SAT's budgets are deterministic (``max_deterministic_time``), so a
search's result depends only on its model and seed unless a safety net
cuts it first. The nets (``Budget``'s cap on a whole search, each solve's
cap: ``cpsat.make_solver``) were wall seconds, and on a loaded machine
they cut searches that a quiet one finishes: the same program built twice
with a cold cache could get two schedules. They are now CPU seconds of the
thread that searches (:func:`now`; with one CP-SAT worker a solve runs in
that thread), which other processes on the machine do not advance.
:class:`CappedSolver` stops a solve when its CPU seconds reach its cap
(CP-SAT's own limits are wall or deterministic seconds); :func:`cuts`
counts the solves a net stopped in this thread, so a search can say that
its result depended on the clock (``Schedule.cut_by_clock``).
"""

from __future__ import annotations

import threading
import time

from ortools.sat.python import cp_model

# How often the watcher reads the solving thread's CPU clock (seconds).
_POLL_S = 0.02

_local = threading.local()


def now() -> float:
  """CPU seconds of the calling thread."""
  return time.thread_time()


def cuts() -> int:
  """How many solves of this thread a CPU cap has stopped so far."""
  return getattr(_local, "cuts", 0)


def _note_cut() -> None:
  _local.cuts = cuts() + 1


def _cpu_clock(num_workers: int) -> int | None:
  """The clock a solve of ``num_workers`` workers is capped on: the
  calling thread's CPU clock with one worker (the solve runs there), the
  process's CPU clock otherwise; None where the platform has neither."""
  if num_workers == 1 and hasattr(time, "pthread_getcpuclockid"):
    return time.pthread_getcpuclockid(threading.get_ident())
  return getattr(time, "CLOCK_PROCESS_CPUTIME_ID", None)


class CappedSolver(cp_model.CpSolver):
  """A ``CpSolver`` whose solves stop after ``cap_s`` CPU seconds.

  With more than one worker the cap is ``cap_s`` per worker of the whole
  process's CPU time. Where the platform has no CPU clock the cap is
  CP-SAT's wall-clock limit instead (the old behaviour).
  """

  def __init__(self, cap_s: float, num_workers: int = 1):
    super().__init__()
    self.cap_s = cap_s
    self._num_workers = max(1, num_workers)
    if _cpu_clock(self._num_workers) is None:
      self.parameters.max_time_in_seconds = cap_s

  def solve(self, model: cp_model.CpModel,
            solution_callback: cp_model.CpSolverSolutionCallback | None = None
            ) -> cp_model.cmh.CpSolverStatus:
    """``CpSolver.solve`` with a watcher thread that stops the search once
    the solve's CPU seconds reach the cap."""
    clock_id = _cpu_clock(self._num_workers)
    if clock_id is None:
      return super().solve(model, solution_callback)
    limit = self.cap_s * self._num_workers
    start = time.clock_gettime(clock_id)
    done, fired = threading.Event(), []

    def watch() -> None:
      while not done.wait(_POLL_S):
        if time.clock_gettime(clock_id) - start >= limit:
          fired.append(True)
          self.stop_search()
          return

    watcher = threading.Thread(target=watch, daemon=True,
                               name="tessel-cpsat-cap")
    watcher.start()
    try:
      return super().solve(model, solution_callback)
    finally:
      done.set()
      watcher.join()
      if fired:
        _note_cut()
