"""Floating-point operations of a lowered program, from XLA's cost analysis.

Shared by the kernel profiles (``cost.measure`` records each kernel's flops)
and the estimates built on them (``cost.estimate``); no jax import, no
project import, so neither depends on the other through it.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

#: Flops charged per transcendental (exp, tanh, ...), as the autocut's
#: roofline does.
TRANSCENDENTAL_FLOPS = 4


def analysed_flops(lowered: Any) -> float | None:
  """Flops of a lowered program from XLA's cost analysis (transcendentals
  counted :data:`TRANSCENDENTAL_FLOPS` each); None when the backend gives
  none."""
  try:
    ca = lowered.cost_analysis()
  except Exception:  # pylint: disable=broad-except  (backend without it)
    return None
  if isinstance(ca, (list, tuple)):
    ca = ca[0] if ca else None
  if not isinstance(ca, Mapping):
    return None
  flops = (float(ca.get("flops", 0.0)) +
           TRANSCENDENTAL_FLOPS * float(ca.get("transcendentals", 0.0)))
  return flops if math.isfinite(flops) and flops > 0 else None
