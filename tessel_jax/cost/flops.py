"""Floating-point operations of a program: from XLA's cost analysis of a
lowered program, or counted on its jaxpr.

Shared by the kernel profiles (``cost.measure`` records each kernel's flops,
counted on the jaxpr it lowers for the compile it times; XLA's count with
``TESSEL_JAX_PROFILE_FLOPS=xla``) and the estimates built on them
(``cost.estimate``: a kernel not measured is only traced, and its flops
counted on the jaxpr). No module-level jax or project import, so neither
depends on the other through it.

The two counts agree: on the README GPT's kernels (vshape(2), mshape(4))
the jaxpr count is 1.00-1.01x XLA's on every kernel above 10 kflops, and
tracing a kernel costs 0.3-0.75x lowering it for the cost analysis (20-90
ms against 50-130 ms per kernel).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

#: Flops charged per transcendental (exp, tanh, ...), as the autocut's
#: roofline does.
TRANSCENDENTAL_FLOPS = 4


def jaxpr_flops(closed_jaxpr: Any) -> float | None:
  """Flops of a (closed) jaxpr, counted per equation as the automatic
  cut's roofline counts them (``passes.eqn_cost``: 2 per
  multiply-add, one per output element, :data:`TRANSCENDENTAL_FLOPS` per
  transcendental element, nested jaxprs inside, a scan's body times its
  length); None when it counts none."""
  jaxpr = getattr(closed_jaxpr, "jaxpr", closed_jaxpr)
  return eqns_flops(jaxpr.eqns)


def eqns_flops(eqns: Any) -> float | None:
  """:func:`jaxpr_flops` of a list of equations (part of a jaxpr)."""
  try:  # installed: passes/ is tessel_jax.passes
    from tessel_jax.passes import eqn_cost  # type: ignore  # pylint: disable=import-outside-toplevel
  except ImportError:  # run from the repository root
    from passes import eqn_cost  # type: ignore  # pylint: disable=import-outside-toplevel
  flops = sum(c.flops for c in eqn_cost.analytic_costs(list(eqns)))
  return float(flops) if math.isfinite(flops) and flops > 0 else None


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
