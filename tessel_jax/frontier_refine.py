"""Refining a screened frontier (``FrontierFunction(refine=k)``): which
screened plans are built again in full, and on what scale the plans left
screened are reported.

Screened prices (estimated kernels, a short search, no stand-in) and full
ones are on different scales; :func:`full_scale` puts them on one.
"""

from __future__ import annotations

import dataclasses
import statistics
from collections.abc import Sequence
from typing import Any

from tessel_jax.frontier_result import PricedPlan
from tessel_jax.plan_candidates import base_of
from tessel_jax.plan_pricing import Pruned


def full_scale(pairs: Sequence[tuple[float, float]]) -> float:
  """Median full / screened price over plans priced both ways (1 with
  none). Screened prices and full ones are on different scales: a full
  build with ``cost="calibrated"`` also times a stand-in of the program,
  which screening skips (README GPT, 4 devices, at load 14: vshape pipe2 x
  dp2 screened at 114.9 ms, 45.7 ms in full), so a screened price is
  compared with full ones only after this factor."""
  ratios = [f / s for s, f in pairs if s > 0 and f > 0]
  return statistics.median(ratios) if ratios else 1.0


def refine(ff: Any, priced: list[PricedPlan], params: Any, batch: Any,
           markers: int | None,
           skipped: list[tuple[str, str]] | None = None) -> None:
  """Builds in full (in place) the ``ff.refine`` fastest fitting screened
  plans, then the fastest fitting plan until it is a full build, and
  every fitting screened plan priced within ``ff.refine_margin`` of the
  fastest fitting full build, its screened price first put on the full
  builds' scale (:func:`full_scale`). A plan whose full build is pruned
  by its lower bound (it cannot beat a plan built in full) is dropped
  with its classic baselines. ``ff``: the ``plans.FrontierFunction``."""
  tried: set[Any] = set()
  pairs: list[tuple[float, float]] = []   # (screened, full) of one plan
  while True:
    i = next_refine(ff, priced, tried, full_scale(pairs))
    if i is None:
      # The plans left screened are reported on the full builds' scale.
      scale = full_scale(pairs)
      priced[:] = [dataclasses.replace(q, step=q.step * scale)
                   if q.screened and q.unit == "ms" else q for q in priced]
      return
    base = base_of(priced[i].candidate)
    tried.add(base)
    screened = next((q.step for q in priced if q.candidate == base), None)
    try:
      full = ff.price(base, params, batch, markers, screen=False)
    except Pruned as err:
      gone = [q for q in priced if base_of(q.candidate) == base]
      priced[:] = [q for q in priced if base_of(q.candidate) != base]
      if skipped is not None:
        skipped.extend((q.label, f"Pruned: {err}") for q in gone)
      continue
    except Exception:  # pylint: disable=broad-except
      continue  # the screened price stands
    if screened is not None and full.unit == "ms" and not full.bound:
      pairs.append((screened, full.step))
    ff._note_best(full)  # pylint: disable=protected-access
    # (it prunes the refines that cannot beat it)
    _replace_base(ff, priced, base, full, params, batch, markers)


def _replace_base(ff: Any, priced: list[PricedPlan], base: Any,
                  full: PricedPlan, params: Any, batch: Any,
                  markers: int | None) -> None:
  """``base``'s screened price and its classic schedules' prices (in
  ``priced``, in place) replaced by those of its full build ``full``."""
  for j, q in enumerate(priced):
    if base_of(q.candidate) != base:
      continue
    priced[j] = (full if q.candidate == base else
                 ff._baseline(q.candidate, full, params, batch,  # pylint: disable=protected-access
                              markers))


def next_refine(ff: Any, priced: Sequence[PricedPlan], tried: set[Any],
                scale: float) -> int | None:
  """Index of the next plan :func:`refine` builds in full (None: done)."""
  limit_bytes = ff.memory_limit

  def on_full_scale(i: int) -> float:
    return priced[i].step * (scale if priced[i].screened else 1.0)
  fits = sorted((i for i, p in enumerate(priced)
                 if limit_bytes is None or p.peak_bytes <= limit_bytes),
                key=lambda i: (on_full_scale(i), priced[i].peak_bytes, i))
  want = [i for i in fits if priced[i].screened and
          base_of(priced[i].candidate) not in tried]
  done_full = [i for i in fits if not priced[i].screened]
  if want and len(tried) < ff.refine:
    return want[0]
  if fits and fits[0] in want:
    return fits[0]   # the fastest fitting plan is always a full build
  if not want or not done_full:
    return None
  i = min(want, key=on_full_scale)
  limit = (1 + ff.refine_margin) * priced[done_full[0]].step
  return i if on_full_scale(i) < limit else None
