"""What one :class:`CostModel` measured once, and what profiling it cost.

The memos keep a build's repeated questions (the link, the per-tick costs,
each plan's stand-in, each program's outside) to one measurement per
CostModel; :class:`Tally` counts the seconds and kernels measured since the
last report (``CostReport.profile_seconds``, ``cache_hit``).
"""

from __future__ import annotations

import dataclasses
from typing import Any


@dataclasses.dataclass
class Tally:
  """Profiling since the last report (mutable: a running count).

  Attributes:
    spent_s: Seconds spent measuring (kernels, ticks, stand-ins, outside).
    measured: Kernels measured (not read from a cache).
    hit: Everything so far came from a cache.
  """

  spent_s: float = 0.0
  measured: int = 0
  hit: bool = True

  def add(self, spent_s: float = 0.0, *, hit: bool = True,
          measured: int = 0) -> None:
    """Counts ``spent_s`` seconds and ``measured`` kernels; ``hit=False``
    marks the report as not all cached."""
    self.spent_s += spent_s
    self.measured += measured
    self.hit = self.hit and hit

  def take(self) -> tuple[float, int, bool]:
    """``(spent_s, measured, hit)`` so far, and starts counting afresh."""
    got = (self.spent_s, self.measured, self.hit)
    self.spent_s, self.measured, self.hit = 0.0, 0, True
    return got


@dataclasses.dataclass
class CostMemo:
  """Figures measured once per CostModel (mutable: filled as asked).

  Attributes:
    link: The search's link model, once chosen.
    ticks: The per-tick costs (``ticks.TickCosts``), once measured.
    per_port_s: ``(seconds per port operation, fixed port operations per
      tick)``, once final (``cost.ports``).
    standin: Stand-in key -> step seconds (None: could not be timed).
    outside: Program key -> seconds outside the ticks.
    gather_links: Key -> link model of the FSDP collectives.
    kernels: Kernel memo of ``measure.profile_kernels``.
  """

  link: Any = None
  ticks: Any = None
  per_port_s: tuple[float, float] | None = None
  standin: dict[str, float | None] = dataclasses.field(default_factory=dict)
  outside: dict[str, float] = dataclasses.field(default_factory=dict)
  gather_links: dict[str, Any] = dataclasses.field(default_factory=dict)
  kernels: dict[str, dict[str, Any]] = dataclasses.field(default_factory=dict)
