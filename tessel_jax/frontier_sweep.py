"""The sweep over a frontier's candidates: each priced once, or skipped.

:func:`price_all` is ``FrontierFunction._price_all``: every candidate (and
its memory-limited variants) built and priced, a classic schedule priced on
the searched plan of its placement, width and N, and a shape whose
searched plan could not be built skipped with the reason for every plan of
that shape.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from tessel_jax import frontier_speculate as _frontier_speculate
from tessel_jax.frontier_result import Candidate, PricedPlan, shape_of
from tessel_jax.plan_candidates import with_limit

if TYPE_CHECKING:
  from tessel_jax.plans import FrontierFunction


def _why(err: Exception) -> str:
  """One line saying why a plan was not priced."""
  return f"{type(err).__name__}: {str(err).splitlines()[0][:300]}"


def _price_one(ff: FrontierFunction, c: Candidate, base: PricedPlan | None,
               params: Any, batch: Any, markers: int | None,
               screen: bool) -> PricedPlan:
  """``c`` priced on ``base`` (a classic schedule of a searched plan
  already priced), else built."""
  if c.plan is not None and base is not None:
    return ff._baseline(c, base, params, batch, markers)  # pylint: disable=protected-access
  return ff.price(c, params, batch, markers, screen)


def price_all(ff: FrontierFunction, todo: Sequence[Candidate], params: Any,
              batch: Any, markers: int | None,
              skipped: list[tuple[str, str]]) -> list[PricedPlan]:
  """Prices every candidate (screened when ``ff.refine`` is set); appends
  ``(label, why)`` to ``skipped`` for each plan not priced."""
  screen = ff.refine is not None
  priced: list[PricedPlan] = []
  failed: dict[tuple[str, int, int, int], str] = {}
  searched: dict[tuple[str, int, int, int], PricedPlan] = {}
  if ff.prune:
    # Widest data parallelism first (shortest pipelines, least bubble):
    # a good plan priced early prunes more of the rest.
    todo = sorted(todo, key=lambda c: c.pipe)
  for cand in todo:
    for c in with_limit(cand, ff.memory_limit):
      shape = shape_of(c)
      own = c.plan is None and c.memory_limit is None  # the shape's search
      why = failed.get(shape)
      if why is None:
        try:
          p = _price_one(ff, c, searched.get(shape), params, batch, markers,
                         screen)
        except Exception as err:  # pylint: disable=broad-except
          # One plan that cannot be built (the program does not fit the
          # placement, or the planner refuses it) is skipped, not fatal.
          why = _why(err)
          if own:
            failed[shape] = why  # the program does not fit the shape
        else:
          priced.append(p)
          ff._note_best(p)  # pylint: disable=protected-access
          if screen:
            _frontier_speculate.after_screened(ff, p, priced)
          if own:
            searched[shape] = p
          continue
      skipped.append((c.label, why))
  return priced
