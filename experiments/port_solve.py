"""The per-port figure one stand-in implies, by inverting the tick replay.

Until ``cost.ports`` fitted its record on up to two stand-ins
(``cost.port_fit``, ``PORTS_VERSION`` 8), the machine's per-port cost was
this solve of one stand-in's time against the replay of its ticks.
``experiments.port_record_probe`` still prints the figure each stand-in
implies on its own, beside the fitted record's.
"""

from __future__ import annotations

from collections.abc import Callable


def solve(target: float, replay: Callable[[float], float], at: float,
          probe: float) -> float:
  """``x >= at`` where ``replay(x)`` (increasing, about linear) equals
  ``target``; ``at`` where ``replay(at)`` already reaches it.

  One secant step from ``at`` over ``probe``, corrected once where the
  shared-core replay bends.

  Args:
    target: Seconds the replay should reach (a stand-in's time).
    replay: Seconds of the replay at a per-port figure ``x``.
    at: Smallest figure taken.
    probe: Step of the secant's first slope.

  Returns:
    The per-port figure, at least ``at``.
  """
  base = replay(at)
  if target <= base:
    return at
  slope = (replay(at + probe) - base) / probe
  if slope <= 0:
    return at
  x = at + (target - base) / slope
  got = replay(x)
  if abs(got - target) > 0.01 * target and got > base:
    x = at + (x - at) * (target - base) / (got - base)
  return max(at, x)
