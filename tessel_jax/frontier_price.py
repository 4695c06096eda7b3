"""Pricing one candidate plan of ``tj.frontier``: build it, read its report.

``FrontierFunction.price`` lands here: a price remembered for the process
(``frontier_memo``) is returned as it is; otherwise the candidate's
``ScheduledFunction`` (``frontier_step``) is built with the shared cost
model set for this build (the kernel estimator of a cheap screening, the
stand-in ceiling of a full one) and its ``step.report`` read into a
:class:`PricedPlan`.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from tessel_jax import frontier_memo as _frontier_memo
from tessel_jax.frontier_result import Candidate, PricedPlan
from tessel_jax.plan_pricing import Pruned

if TYPE_CHECKING:
  from tessel_jax.plans import FrontierFunction


def price(ff: FrontierFunction, c: Candidate, params: Any, batch: Any,
          markers: int | None, screen: bool, ceiling: bool) -> PricedPlan:
  """Builds ``c`` and reads its price (see ``FrontierFunction.price``); a
  build's error is remembered with the plan's key, then raised."""
  key = _frontier_memo.plan_key(ff._key, c, ff._screen_tag(screen))  # pylint: disable=protected-access
  hit = _frontier_memo.remembered(ff, key, c, ceiling)
  if hit is not None:
    return hit
  t0 = time.perf_counter()
  step = ff.step_for(c, markers, screen)
  try:
    ff.costs.estimator = (ff.estimator if screen and ff.estimator is not None
                          else None)
    ff.costs.standin_ceiling_s = (ff._standin_ceiling(screen)  # pylint: disable=protected-access
                                  if ceiling else None)
    built = step.build(params, batch)
  except Pruned:
    raise
  except Exception as err:  # pylint: disable=broad-except
    if key is not None:
      _frontier_memo.remember_error(key, err)
    raise
  finally:
    ff.costs.estimator = None
    ff.costs.standin_ceiling_s = None
  out = priced_plan(ff, c, built, screen, time.perf_counter() - t0)
  if key is not None:
    _frontier_memo.remember(key, out, step)
  return out


def priced_plan(ff: FrontierFunction, c: Candidate, built: Any,
                screen: bool, seconds: float) -> PricedPlan:
  """The :class:`PricedPlan` of ``c`` read from its build's report: the
  predicted step in ms when the costs were measured, else the makespan in
  steps."""
  rep = built.report
  measured = rep is not None and rep.predicted_step_ms is not None
  return PricedPlan(
      candidate=c,
      step=rep.predicted_step_ms if measured else float(
          built.unrolled.makespan),
      unit="ms" if measured else "steps",
      peak_bytes_per_device=tuple(int(b) for b in rep.peak_memory_bytes),
      source=built.unrolled.source,
      blocks=len(built.partition.blocks),
      build_seconds=seconds,
      screened=screen and measured and c.plan is None,
      bound=measured and bool(getattr(ff.costs, "bound_last", False)))
