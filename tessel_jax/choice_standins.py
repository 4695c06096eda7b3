"""One build's close candidate schedules: their stand-ins timed side by side.

With ``cost="calibrated"`` a build prices each candidate schedule
(``schedule_choice``: searched on the measured spans, on a coarser grid, on
uniform spans) on one timing of its own stand-in program
(``cost.calibrate.time_step``, ~1.5 s of one window). On this 2-core
machine one stand-in timed again eight times in shuffled turns gave 10.3 to
15.7 ms where its single timing in the build had said 21.2 (eqx_transformer,
``vshape(2)``, N = 8), and the stand-in figure is a third to a half of the
price. The build lowers the cheapest price, so among close candidates it
takes the one whose window happened to be quiet, and that plan is the one
predicted too fast (the model zoo, session 46: every plan chosen on measured
spans 1.06-1.53x slower than predicted, the uniform-span plans 0.77-1.20).

So before the build takes the cheapest, every candidate priced within
:data:`MARGIN` of it on a stand-in of its own is timed again with the
others in the same rounds (``paired_standins.paired_seconds``: a median of
per-round ratios, the geometric mean of the single timings kept), the
figures replace the single ones (memo and disk cache: later prices of the
same plans read them) and those candidates are priced again.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from typing import Any

from tessel_jax import paired_standins as _paired
from tessel_jax.cost import calibrate as _calibrate
from tessel_jax.cost import processes as _processes

_LOG = logging.getLogger(__name__)

#: Candidates priced within this fraction of the cheapest are re-timed:
#: wider than ``paired_standins.MARGIN`` (0.15), as a stand-in's single
#: timing in the build was 0.68-1.63x the median of eight later ones
#: (eqx_transformer, two builds, six stand-ins: a plan priced 15.4% below
#: the next had its stand-in timed at 10.04 ms against 14.72 later, the
#: next at 12.26 against 15.89).
MARGIN = 0.5
#: Seconds the paired timing may take (its samples are cut to fit, never
#: below :data:`MIN_SAMPLES` per stand-in).
BUDGET_S = 1.0
#: Fewest and most samples per stand-in.
MIN_SAMPLES = 9
MAX_SAMPLES = _paired.ROUNDS * _paired.REPEATS


def close_candidates(priced: Sequence[Any], margin: float | None = None
                     ) -> list[Any]:
  """The candidates priced on a stand-in timed in this build
  (``Priced.extra_s`` set) within ``margin`` (:data:`MARGIN` by default) of
  the cheapest of them, when there are at least two; else ``[]``."""
  margin = MARGIN if margin is None else margin
  own = [p for p in priced if p.extra_s is not None]
  if len(own) < 2:
    return []
  best = min(p.seconds for p in own)
  close = [p for p in own if p.seconds <= best * (1.0 + margin)]
  return close if len(close) >= 2 else []


def rounds_and_repeats(total_s: float, budget_s: float = BUDGET_S
                       ) -> tuple[int, int]:
  """``(rounds, repeats)`` of a paired timing whose samples, one of each
  stand-in per turn (``total_s``: their seconds summed), fit ``budget_s``,
  between :data:`MIN_SAMPLES` and :data:`MAX_SAMPLES` per stand-in."""
  n = int(budget_s / max(total_s, 1e-9))
  n = max(MIN_SAMPLES, min(MAX_SAMPLES, n))
  rounds = min(_paired.ROUNDS, max(3, n // 3))
  return rounds, max(1, n // rounds)


def recheck(step: Any, priced: Sequence[Any], price: Any
            ) -> tuple[list[Any], str]:
  """``priced`` with the close candidates (:func:`close_candidates`)
  priced again on stand-in figures timed side by side, and a note for the
  progress line ("" when nothing was re-timed).

  Args:
    step: The ScheduledFunction being built (its ``choice_standins``: the
      stand-in programs compiled by this build's pricing, or None).
    priced: The candidates priced (``schedule_choice.Priced``).
    price: ``Priced -> Priced``: the candidate priced again (it reads the
      stand-in figures just stored).
  """
  programs = getattr(step, "choice_standins", None)
  model = step._costs  # pylint: disable=protected-access
  close = close_candidates(priced)
  if (programs is None or not close or not model.calibrated or
      not _processes.single_process()):
    return list(priced), ""
  runs = {p.name: _calibrate.kept_runner(
      programs, _calibrate.standin_plan(p.plan)) for p in close}
  if any(r is None for r in runs.values()):
    return list(priced), ""  # a figure from the disk cache: not timed here
  t0 = time.perf_counter()
  old = {p.name: model._standin_seconds(p.plan, step.mesh, step.pipe_axis)  # pylint: disable=protected-access
         for p in close}
  if any(s is None or s <= 0 for s in old.values()):
    return list(priced), ""
  rounds, repeats = rounds_and_repeats(sum(old.values()))
  try:
    new = _paired.paired_seconds(
        {n: _paired.timed_sampler(r) for n, r in runs.items()}, old,
        rounds=rounds, repeats=repeats)
  except Exception as err:  # pylint: disable=broad-except
    _LOG.warning("tessel_jax: the close candidates' stand-ins could not be"
                 " timed again side by side (%s: %s); their single timings"
                 " stay", type(err).__name__, err)
    return list(priced), ""
  by_name = {p.name: p for p in close}
  for name, sec in new.items():
    model.set_standin_seconds(by_name[name].plan, step.mesh, step.pipe_axis,
                              sec)
  again = {p.name: price(p) for p in close}
  note = (f"{time.perf_counter() - t0:.2f} s, " + ", ".join(
      f"{n} {old[n] * 1e3:.2f} -> {new[n] * 1e3:.2f} ms" for n in old))
  return [again.get(p.name, p) for p in priced], note

