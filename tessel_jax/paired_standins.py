"""The close leaders' stand-in programs timed again side by side.

With ``cost="calibrated"`` each searched plan is priced on one timing of
its stand-in program (``cost.calibrate``), and the classic schedules of its
placement, width and N inherit that calibration. One timing is one window
of ~0.2 s, and windows seconds apart vary by +-25% on a loaded machine
(hf_gpt2, 4 devices: one executable timed six times gave 9.2-15.0 ms), so
one unlucky window can flip the choice between placements (BENCHMARKS.md,
helper "lim9", session 33: interleaved priced 0.92x vshape, measured
1.13x). Timed side by side, in the same rounds, the two stand-ins ranked
right 12 of 12 times.

So before ``placement="auto"`` chooses, when the fastest fitting plan and
the fastest fitting plan priced on another stand-in program are within
:data:`MARGIN`, both stand-ins (kept compiled by their builds) are timed
in turns, :data:`ROUNDS` rounds of :data:`REPEATS` shuffled turns; the
median of the per-round ratios replaces the ratio of the two single
timings (their geometric mean is kept: only the ranking is re-measured),
and every plan priced on either stand-in moves by its stand-in's change
(the price moves 1:1 with the stand-in seconds, lim9's probe 2: +0.72 ms
for +0.72 ms).
"""

from __future__ import annotations

import dataclasses
import logging
import math
import random
import statistics
import time
from collections.abc import Callable, Hashable, Mapping, Sequence
from typing import Any

from tessel_jax.cost import calibrate as _calibrate
from tessel_jax.cost import compile_pool as _compile_pool
from tessel_jax.frontier_result import Candidate, PricedPlan

_LOG = logging.getLogger(__name__)

#: Leaders priced within this fraction of the fastest are timed again.
MARGIN = 0.15
#: Rounds of the paired timing (a ratio of medians each).
ROUNDS = 7
#: Samples per stand-in and round, taken in turns in a shuffled order.
REPEATS = 5

#: This process's paired re-timings: (program key, stand-ins) -> seconds.
_MEMO: dict[Any, dict[Candidate, float]] = {}


def standin_of(c: Candidate) -> Candidate:
  """The searched candidate whose stand-in program prices ``c`` (a classic
  schedule is priced on its placement's unlimited searched build)."""
  if c.plan is None:
    return c
  return dataclasses.replace(c, plan=None, memory_limit=None)


def leaders(plans: Sequence[PricedPlan], memory_limit: int | None,
            margin: float | None = None) -> list[Candidate]:
  """Stand-ins of the fastest fitting plan and of the fastest fitting plan
  priced on another stand-in, when that one is within ``margin`` of the
  first; else ``[]``. Only measured full builds count (a screened or
  lower-bound price has no stand-in timing of its own). ``margin``:
  :data:`MARGIN` by default."""
  margin = MARGIN if margin is None else margin
  fits = sorted((p for p in plans
                 if p.unit == "ms" and not p.screened and not p.bound and
                 (memory_limit is None or p.peak_bytes <= memory_limit)),
                key=lambda p: p.step)
  if not fits:
    return []
  first = standin_of(fits[0].candidate)
  for p in fits[1:]:
    other = standin_of(p.candidate)
    if other != first:
      if p.step <= fits[0].step * (1.0 + margin):
        return [first, other]
      _LOG.info("tessel_jax: %s priced %.1f%% above %s: stand-ins not"
                " re-timed", p.label, 100 * (p.step / fits[0].step - 1),
                fits[0].label)
      return []
  return []


def paired_seconds(samplers: Mapping[Hashable, Callable[[], float]],
                   old: Mapping[Hashable, float], rounds: int = ROUNDS,
                   repeats: int = REPEATS, rng: random.Random | None = None
                   ) -> dict[Hashable, float]:
  """Seconds of each stand-in, re-ranked by side-by-side timing.

  Args:
    samplers: Per stand-in, a call timing one step of it (seconds).
    old: Per stand-in, the seconds its plans were priced on.
    rounds: Rounds; a round's ratio is the median of a stand-in's samples
      over the first stand-in's.
    repeats: Samples per stand-in and round, taken in turns (each turn in
      a shuffled order), so the stand-ins share the machine's load.
    rng: Shuffles the order (seeded by default).

  Returns:
    Per stand-in: ``G * r / geomean(r)``, ``r`` the median of its round
    ratios, ``G`` the geometric mean of ``old`` (only the ranking is
    measured again).
  """
  rng = rng or random.Random(0)
  keys = list(samplers)
  ratios: dict[Hashable, list[float]] = {k: [] for k in keys}
  for _ in range(rounds):
    got: dict[Hashable, list[float]] = {k: [] for k in keys}
    for _ in range(repeats):
      order = keys[:]
      rng.shuffle(order)
      for k in order:
        got[k].append(float(samplers[k]()))
    first = statistics.median(got[keys[0]])
    for k in keys:
      ratios[k].append(statistics.median(got[k]) / first)
  med = {k: statistics.median(v) for k, v in ratios.items()}
  level = math.exp(statistics.fmean(math.log(old[k]) for k in keys))
  spread = math.exp(statistics.fmean(math.log(med[k]) for k in keys))
  return {k: level * med[k] / spread for k in keys}


def repriced(plans: Sequence[PricedPlan], old: Mapping[Candidate, float],
             new: Mapping[Candidate, float]) -> list[PricedPlan]:
  """``plans`` with every plan priced on a re-timed stand-in moved by its
  change (ms; the price moves 1:1 with the stand-in seconds)."""
  out = []
  for p in plans:
    k = standin_of(p.candidate)
    if k in new and p.unit == "ms" and not p.screened and not p.bound:
      p = dataclasses.replace(p, step=p.step + (new[k] - old[k]) * 1e3)
    out.append(p)
  return out


def _old_seconds(steps: Mapping[Candidate, Any], c: Candidate
                 ) -> float | None:
  """Seconds ``c``'s plans were priced on (None: no stand-in program kept
  by its build, or none timed: ``cost="measured"``, or a lower bound)."""
  step = steps.get(c)
  built = getattr(step, "built", None)
  if (built is None or getattr(step, "standin_program", None) is None or
      not step._costs.calibrated):  # pylint: disable=protected-access
    return None  # cost="measured": no plan is priced on its own stand-in
  old = step._costs._standin_seconds(  # pylint: disable=protected-access
      built.plan, step.mesh, step.pipe_axis)
  return None if old is None or old <= 0 else float(old)


def _sampler_of(step: Any, params: Any, batch: Any) -> Callable[[], float]:
  """Times one step of ``step``'s stand-in program per call (capped by the
  process CPU time, ``calibrate.sample_seconds``): the program compiled
  when its plan was priced (``calibrate.kept_runner``), else compiled now
  (its seconds read from the disk cache)."""
  plan = _calibrate.standin_plan(step.built.plan)
  run = _calibrate.kept_runner(step.standin_program, plan)
  if run is None:
    run = _calibrate.program_runner(step.standin_program, params, batch,
                                    plan)
  return timed_sampler(run)


def timed_sampler(run: Callable[[], Any]) -> Callable[[], float]:
  """A call timing one call of ``run`` (a compiled stand-in step, warmed
  up here), capped by the process CPU time
  (``calibrate.sample_seconds``), with no background compile running."""
  import jax  # pylint: disable=import-outside-toplevel
  _compile_pool.drain()  # no background compile while timing
  cores = _calibrate.cpu_cores_of(jax.block_until_ready(run()))  # warm up

  def sample() -> float:
    _compile_pool.drain()  # no background compile while timing
    t0, c0 = time.perf_counter(), time.process_time()
    jax.block_until_ready(run())
    return _calibrate.sample_seconds(time.perf_counter() - t0,
                                     time.process_time() - c0, cores)
  return sample


def recheck(plans: Sequence[PricedPlan], steps: Mapping[Candidate, Any],
            params: Any, batch: Any, memory_limit: int | None,
            key: Any = None) -> list[PricedPlan]:
  """``plans`` re-priced from a paired timing of the two close leaders'
  stand-ins (:func:`leaders`); unchanged when none are close, or a
  stand-in cannot be rebuilt or run (logged). ``steps``: the priced
  ``ScheduledFunction`` of each candidate; ``key``: the program's key for
  this process's memo (None: none). The stand-in programs the builds kept
  compiled are dropped after it."""
  try:
    return _recheck(plans, steps, params, batch, memory_limit, key)
  finally:
    for step in steps.values():
      getattr(getattr(step, "standin_program", None), "compiled", {}).clear()


def _recheck(plans: Sequence[PricedPlan], steps: Mapping[Candidate, Any],
             params: Any, batch: Any, memory_limit: int | None,
             key: Any) -> list[PricedPlan]:
  """:func:`recheck`."""
  lead = leaders(plans, memory_limit)
  if not lead:
    return list(plans)
  memo_key = None if key is None else (key, tuple(lead))
  t0 = time.perf_counter()
  try:
    old = {c: _old_seconds(steps, c) for c in lead}
    if any(s is None for s in old.values()):
      return list(plans)
    new = _MEMO.get(memo_key) if memo_key is not None else None
    if new is None:
      new = paired_seconds(
          {c: _sampler_of(steps[c], params, batch) for c in lead}, old)
  except Exception as err:  # pylint: disable=broad-except
    _LOG.warning("tessel_jax: the leaders' stand-ins could not be timed"
                 " again side by side (%s: %s); their single timings stay",
                 type(err).__name__, err)
    return list(plans)
  if memo_key is not None:
    _MEMO[memo_key] = new
  _LOG.info("tessel_jax: stand-ins re-timed side by side in %.2f s: %s",
            time.perf_counter() - t0,
            ", ".join(f"{c.label} {old[c] * 1e3:.2f} -> {new[c] * 1e3:.2f} ms"
                      for c in lead))
  return repriced(plans, old, new)
