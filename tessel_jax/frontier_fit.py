"""The last check of ``placement="auto"``: the plan chosen fits the memory
limit once built in full, else the next fitting plan is taken.

A frontier's prices are not all full builds: a screened plan's peak leaves
out the kernel workspace (known once its kernels are compiled), and a
classic schedule priced on a screened build inherits that; a plan whose
full build raised keeps its screened price (``frontier_refine.refine``).
eqx_transformer, 8 devices, session 34: a screened plan fitted
``between:0.33`` = 418,041 B and its full build found no schedule under it
(BENCHMARKS.md, helper "plan5"). :func:`build_fitting` builds the fastest
plan that fits by its price in full, reads the peak of that build, and
when it is over the limit (or the build finds no schedule under it) puts
the full peak in the plan's place (or drops the plan) and chooses again.
"""

from __future__ import annotations

import dataclasses
import logging
from typing import Any

from tessel_jax.frontier_result import (PricedPlan, ProgramFrontier,
                                        choose_index, pareto)
from tessel_jax.plan_pricing import Pruned

try:  # installed: passes/ is tessel_jax.passes
  from tessel_jax.passes import errors as _errors  # type: ignore
except ImportError:  # run from the repository root
  from passes import errors as _errors  # type: ignore

_LOG = logging.getLogger("tessel_jax")


@dataclasses.dataclass(frozen=True)
class Fitted:
  """What :func:`build_fitting` gives back.

  Attributes:
    frontier: The frontier with the plans built here at their full peaks
      (searched plans at their full prices) and those whose full build
      failed moved to ``skipped``.
    winner: The plan built (None: no plan fits).
    step: Its ``ScheduledFunction`` (None: no plan fits).
    built: Its ``Built`` (None: no plan fits).
  """

  frontier: ProgramFrontier
  winner: PricedPlan | None = None
  step: Any = None
  built: Any = None


def build_fitting(ff: Any, fr: ProgramFrontier, limit: int | None,
                  params: Any, batch: Any) -> Fitted:
  """The fastest plan of ``fr`` whose full build fits ``limit``, built.

  Each pass takes the fastest plan that fits by its price
  (``choose_index``) and builds it in full (a screened plan, or one not
  built in this process, e.g. a classic schedule priced by replay or a
  frontier read from the disk cache, through ``ff.price``); a plan whose
  full peak is over ``limit`` stays in the frontier at that peak, a plan
  whose full build raises ``TesselError`` (no schedule under its search's
  limit) or is pruned is dropped with the reason, and the choice is made
  again. A screened searched plan is replaced by its full price, so the
  choice ends on a plan whose price and peak are its full build's. Stops
  when the plan chosen is one already built here (at most one build per
  plan). When no plan fits, the smallest-peak plan is built in full the
  same way until it is one built here, so the smallest peak the caller's
  error names is a limit the plan fits in full.

  Args:
    ff: The ``plans.FrontierFunction`` that priced ``fr``.
    fr: Its frontier.
    limit: Bytes per device (None: none; the first choice is built as is).
    params, batch: The inputs.
  """
  plans = list(fr.plans)
  skipped = list(fr.skipped)
  done: dict[Any, tuple[Any, Any]] = {}   # candidate -> (step, built)
  while True:
    i = choose_index(plans, limit)
    if i is None:
      # No plan fits: the smallest peak, which the error names as the
      # limit to pass, is a full build's too.
      i = None if limit is None else _smallest_not_built(plans, done)
      if i is None:
        return Fitted(frontier=_with(fr, plans, skipped))
    elif plans[i].candidate in done:
      step, built = done[plans[i].candidate]
      return Fitted(frontier=_with(fr, plans, skipped), winner=plans[i],
                    step=step, built=built)
    p = plans[i]
    try:
      full, step, built = _full_build(ff, p, params, batch)
    except (_errors.TesselError, Pruned) as err:
      del plans[i]
      why = (f"{type(err).__name__} in its full build (placement='auto'):"
             f" {str(err).splitlines()[0]}")
      skipped.append((p.label, why))
      _LOG.info("placement='auto': %s dropped, %s", p.label, why)
      continue
    if limit is not None and full.peak_bytes > limit >= p.peak_bytes:
      _LOG.info("placement='auto': %s peaks at %d bytes in full (%d"
                " priced), over memory_limit=%d: the next fitting plan",
                p.label, full.peak_bytes, p.peak_bytes, limit)
    plans[i] = full
    done[p.candidate] = (step, built)


def _full_build(ff: Any, p: PricedPlan, params: Any, batch: Any
                ) -> tuple[PricedPlan, Any, Any]:
  """``(p at its full build's peak, step, built)``: ``p``'s candidate
  built in full when it is screened or has no step in ``ff`` yet. A
  searched plan is priced by its full build; a classic one keeps its
  price (its replay on the searched plan's build) with the full peak."""
  c = p.candidate
  if p.screened or c not in ff.steps:
    priced = ff.price(c, params, batch, ff.markers)
    if c.plan is None:
      p = priced
  step = ff.steps[c]
  built = step.build(params, batch)
  peaks = tuple(int(b) for b in built.report.peak_memory_bytes)
  if peaks != p.peak_bytes_per_device:
    p = dataclasses.replace(p, peak_bytes_per_device=peaks)
  return p, step, built


def _smallest_not_built(plans: list[PricedPlan],
                        done: dict[Any, Any]) -> int | None:
  """Index of the smallest-peak plan (``ProgramFrontier.smallest_peak``'s
  order) when it was not built here yet, else None."""
  if not plans:
    return None
  i = min(range(len(plans)),
          key=lambda j: (plans[j].peak_bytes, plans[j].step))
  return None if plans[i].candidate in done else i


def _with(fr: ProgramFrontier, plans: list[PricedPlan],
          skipped: list[tuple[str, str]]) -> ProgramFrontier:
  """``fr`` with ``plans`` and ``skipped`` (the Pareto set again)."""
  if tuple(plans) == fr.plans and tuple(skipped) == fr.skipped:
    return fr
  return dataclasses.replace(fr, plans=tuple(plans), pareto=pareto(plans),
                             skipped=tuple(skipped))
