"""Real-time (round-robin) priority for benchmark workers on a shared machine.

A worker at ``SCHED_RR`` runs its device threads undisturbed by other jobs
(the kernel still leaves other processes 5% of every second); without it
both profiles and timed steps carry the other jobs' load. Round-robin, not
FIFO: threads pinned to one core while a kernel is profiled must still take
turns. Setting it needs root or ``CAP_SYS_NICE``; every helper here fails
soft and says what it got, so runners record whether the priority held.

Used by ``cost_bench``, ``inference_speedup`` and ``model_zoo_spans``.
"""

from __future__ import annotations

import os

REALTIME_PRIORITY = 10


def _set_threads(policy: int, priority: int) -> int:
  """Sets every thread of this process; returns how many took it."""
  done = 0
  try:
    for tid in os.listdir("/proc/self/task"):
      os.sched_setscheduler(int(tid), policy, os.sched_param(priority))
      done += 1
  except (OSError, AttributeError):
    pass
  return done


def realtime_threads() -> int:
  """Puts every thread of this process (XLA's device threads included) at
  ``SCHED_RR``; threads made later inherit it.

  Returns:
    How many threads it could set (0 without root or CAP_SYS_NICE).
  """
  return _set_threads(os.SCHED_RR, REALTIME_PRIORITY)


def normal_priority() -> None:
  """Every thread of this process back to ``SCHED_OTHER``."""
  _set_threads(os.SCHED_OTHER, 0)


def realtime_process() -> bool:
  """Puts this process (its main thread; what it starts inherits it) at
  ``SCHED_RR``, e.g. in a ``subprocess`` ``preexec_fn``; True if it took."""
  try:
    os.sched_setscheduler(0, os.SCHED_RR, os.sched_param(REALTIME_PRIORITY))
    return True
  except (OSError, AttributeError):
    return False


def realtime_now() -> bool:
  """Whether this thread runs at a real-time policy (RR or FIFO)."""
  try:
    return os.sched_getscheduler(0) in (os.SCHED_RR, os.SCHED_FIFO)
  except (OSError, AttributeError):
    return False
