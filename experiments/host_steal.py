"""The host's stolen CPU time, to tell a slow step from a disturbed machine.

A virtual machine's cores can be taken by the hypervisor for other guests
("steal": the 8th figure of ``/proc/stat``'s ``cpu`` line). It does not
show in the load average, and a step timed while it happens runs slower
by the wall clock only: its process CPU time stays the same. Session 42's
quiet re-measure saw the README main job step at 183-241 ms in two runs
and 119-121 ms in the two around them; the process CPU per step and the
steal during the steps tell such a run apart from a slower program
(``experiments.train`` records both).
"""

from __future__ import annotations

import os

#: The kernel's clock ticks per second (``/proc/stat``'s unit).
_TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def steal_seconds(stat: str = "/proc/stat") -> float | None:
  """Seconds of CPU stolen from this machine since boot, all cores (None
  where ``stat`` is missing or has no steal figure)."""
  try:
    with open(stat) as f:
      fields = f.readline().split()
  except OSError:
    return None
  if len(fields) < 9 or fields[0] != "cpu":
    return None
  return int(fields[8]) / _TICKS
