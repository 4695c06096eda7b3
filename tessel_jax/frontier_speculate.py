"""Compiling, during the screening, the kernels the refine will measure.

A screening build of ``placement="auto"`` (``FrontierFunction(refine=k,
screen_estimate=True)``) estimates the kernels not measured yet from their
flops; the plans then built in full compile and time them, one after
another, after the screening. The screening itself is Python and CP-SAT on
one thread: on a 2-core machine the second core idles through it.
:func:`after_screened` hands the estimated kernels of a screened plan
priced within ``refine_margin`` of the fastest fitting screened plan so far
(one the refine is likely to build in full) to a background compile thread
(``cost.compile_pool.BACKGROUND``); the full build's profile takes them
compiled. Every timing in the process waits for that thread first
(``compile_pool.drain``), so no kernel is timed beside a compile.
``compile_pool.SPECULATE = True`` turns it on (off by default: not yet
measured faster on a quiet machine).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from tessel_jax.cost import compile_pool as _compile_pool
from tessel_jax.cost import measure as _measure
from tessel_jax.frontier_result import PricedPlan


def _fits(p: PricedPlan, limit: int | None) -> bool:
  return limit is None or p.peak_bytes <= limit


def worth_compiling(p: PricedPlan, priced: Sequence[PricedPlan],
                    margin: float, limit: int | None) -> bool:
  """Whether ``p`` (a searched plan just screened, in ``priced``) is
  within ``margin`` of the fastest fitting screened plan in ``priced``."""
  if not (p.screened and p.unit == "ms" and p.candidate.plan is None and
          _fits(p, limit)):
    return False
  best = min((q.step for q in priced
              if q.screened and q.unit == "ms" and _fits(q, limit)),
             default=p.step)
  return p.step <= (1.0 + margin) * best


def after_screened(ff: Any, p: PricedPlan,
                   priced: Sequence[PricedPlan]) -> int:
  """Hands the estimated kernels of ``p`` (just screened by ``ff``, a
  ``plans.FrontierFunction``) to the background compile when it is worth
  it (:func:`worth_compiling`); returns how many were handed over."""
  if not (_compile_pool.SPECULATE and ff.screen_estimate and
          worth_compiling(p, priced, ff.refine_margin, ff.memory_limit)):
    return 0
  step = ff.steps.get(p.candidate)
  profile = getattr(getattr(step, "built", None), "profile", None)
  if profile is None:
    return 0
  keys = [k.key for _, k in sorted(profile.kernels.items())]
  return _measure.compile_in_background(keys)


def finish() -> None:
  """Drops the kernels compiled in the background and not taken (after
  waiting for the thread), and the estimated kernels not handed over:
  called once a frontier is priced."""
  _compile_pool.BACKGROUND.clear()
  _measure.forget_estimated()
