"""The pick among a build's candidate schedules (measured costs).

The schedule searched on the measured spans is the first candidate; the
others (``step_schedule.candidates``: the same spans on a coarser grid,
uniform spans) are searched in turn and priced by one loop
(:func:`choose`) on ``CostModel.step_seconds``, the figure the report
predicts. A candidate in the same order as one found before it makes the
same tick plan, so it is not priced again; the cheapest is lowered (ties:
the earlier), after the close ones' stand-in programs are timed again side by
side (``choice_standins``: one timing each is too noisy to rank them).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from tessel_jax import choice_standins as _choice_standins
from tessel_jax.cost import processes as _processes

#: :func:`choose`: a candidate after the first is first priced with the
#: per-tick seconds of the cheapest plan so far's stand-in
#: (``CostModel.replay_like``); its own stand-in program is compiled and
#: timed only when that estimate is below ``1 + ALT_STANDIN_MARGIN`` times
#: the cheapest price so far. Two schedules of one build's kernels had
#: stand-in figures up to ~30% apart per tick (README GPT, interleaved
#: pipe2 x dp2), about a third of the price: 10% keeps every close call
#: calibrated. README GPT, 4 devices, cold choice: most second stand-ins
#: were of schedules that lost.
ALT_STANDIN_MARGIN = 0.10

#: The first candidate's name: the schedule searched on the measured spans.
FIRST = "measured"


@dataclasses.dataclass(frozen=True)
class Candidate:
  """A schedule the build may lower instead of the first.

  Attributes:
    name: What the report calls it (``"coarse"``, ``"uniform"``).
    spans: The spans it is searched on, for the progress line.
    search: ``() -> (graph, schedule, unrolled)`` or None (no schedule).
  """

  name: str
  spans: str
  search: Callable[[], Any]


@dataclasses.dataclass(frozen=True)
class Priced:
  """One candidate found and priced.

  Attributes:
    name: The candidate's name.
    found: Its ``(graph, schedule, unrolled)`` (None: the first, whose
      search the build already holds).
    unrolled: Its unrolled schedule.
    plan: Its tick plan.
    seconds: Its predicted step (every process's: process 0's).
    extra_s: Seconds per kernel call its stand-in added
      (:func:`standin_extra`; None: none timed, or only estimated).
  """

  name: str
  found: Any
  unrolled: Any
  plan: Any
  seconds: float
  extra_s: float | None = None


@dataclasses.dataclass(frozen=True)
class Choice:
  """The candidates priced and the one taken.

  Attributes:
    priced: The distinct candidates priced, in search order.
    taken: The name of the one lowered.
    twins: Candidate -> the earlier one in the same order (not priced).
    found: Every candidate found, in search order.
  """

  priced: tuple[Priced, ...]
  taken: str
  twins: Mapping[str, str] = dataclasses.field(default_factory=dict)
  found: tuple[str, ...] = ()

  @property
  def chosen(self) -> Priced:
    """The candidate lowered."""
    return next(p for p in self.priced if p.name == self.taken)

  @property
  def candidate_ms(self) -> dict[str, float]:
    """Every candidate found -> its predicted ms, in search order; a twin
    has its earlier candidate's (the same tick plan)."""
    ms = {p.name: 1e3 * p.seconds for p in self.priced}
    ms.update({t: ms[o] for t, o in self.twins.items()})
    return {n: ms[n] for n in self.found or ms}

  @property
  def alternative_ms(self) -> float | None:
    """The cheapest other distinct candidate's predicted ms; the taken
    one's own where every other was its twin; None: nothing compared."""
    others = [1e3 * p.seconds for p in self.priced if p.name != self.taken]
    if others:
      return min(others)
    return 1e3 * self.chosen.seconds if self.twins else None

  def take(self, name: str) -> Choice:
    """This choice lowering candidate ``name`` instead (unchanged when it
    was not priced); for experiments that force one."""
    if all(p.name != name for p in self.priced):
      return self
    return dataclasses.replace(self, taken=name)


def same_order(a: Sequence[Any], b: Sequence[Any]) -> bool:
  """Whether two unrolled schedules start the same blocks together in the
  same order (their start steps may be in other units): then they make
  the same tick plan (``passes.plan.build_plan`` numbers the distinct
  start steps), so they are predicted the same."""
  def order(actions: Sequence[Any]) -> list[tuple[int, int, int]]:
    rank = {s: t for t, s in enumerate(sorted({x.start for x in actions}))}
    return sorted((rank[x.start], x.block, x.microbatch) for x in actions)
  return len(a) == len(b) and order(a) == order(b)


def choose(step: Any, costs: Any, unrolled: Any, plan: Any,
           candidates: Sequence[Candidate], make_plan: Callable[[Any], Any],
           clock: Any) -> Choice | None:
  """Searches ``candidates`` in turn, then prices each distinct one (the
  searches and tick plans first: ``cost.price_ahead`` compiles the first
  price's programs meanwhile).

  Args:
    step: The ScheduledFunction being built (``step._costs`` prices).
    costs: The build's measured costs.
    unrolled: The first candidate: the schedule searched on the measured
      spans.
    plan: Its tick plan.
    candidates: The others, in the order ties go to.
    make_plan: ``actions -> tick plan``.
    clock: The build's progress clock.

  Returns:
    The :class:`Choice`; None when no other candidate was found (nothing
    priced: the first is lowered).
  """
  found_before = [(FIRST, unrolled)]
  twins: dict[str, str] = {}
  distinct = []  # (name, found, its tick plan)
  for cand in candidates:  # every search and tick plan before any price
    found = cand.search()
    twin = None if found is None else next(
        (n for n, u in found_before if same_order(found[2].actions,
                                                  u.actions)), None)
    clock.lap(f"search on {cand.spans}", "none" if found is None else
              f"the same order as {twin}" if twin else "another order")
    if found is None:
      continue
    if twin is not None:
      twins[cand.name] = twin
      continue
    found_before.append((cand.name, found[2]))
    distinct.append((cand.name, found, make_plan(found[2].actions)))
  priced: list[Priced] = []
  if distinct or twins:  # priced once another is found (FSDP, outside)
    priced.append(_price(step, costs, FIRST, None, unrolled, plan))
  for name, found, its_plan in distinct:
    best = min(priced, key=lambda p: p.seconds)
    priced.append(_price(step, costs, name, found, found[2], its_plan, best))
  if not priced:
    clock.lap("price", "no other schedule: the first lowered unpriced")
    return None
  priced, note = _choice_standins.recheck(
      step, priced, lambda p: _reprice(step, costs, p))
  taken = min(priced, key=lambda p: p.seconds).name  # ties: the earlier
  clock.lap("price", f"{len(priced)} schedule(s), lowering the one searched"
            f" on {taken} spans" + (f"; the close ones' stand-ins timed"
                                    f" again side by side: {note}"
                                    if note else ""))
  found = tuple(n for n, _ in found_before) + tuple(twins)
  order = [FIRST] + [c.name for c in candidates]
  return Choice(tuple(priced), taken, twins,
                tuple(sorted(found, key=order.index)))


def _price(step: Any, costs: Any, name: str, found: Any, run: Any, plan: Any,
           best: Priced | None = None) -> Priced:
  """``run`` lowered as ``plan``, priced on ``CostModel.step_seconds``
  (FSDP collectives and the outside terms included, with the per-call
  figure its stand-in measured); after a ``best`` with a stand-in figure,
  first estimated with that figure and its own stand-in timed only when
  it may win (``ALT_STANDIN_MARGIN``). Every process takes process 0's
  figure."""
  model = step._costs  # pylint: disable=protected-access
  guess = (None if best is None else
           _guess_alt(step, costs, run, plan, best.extra_s))
  if guess is not None and guess >= best.seconds * (1 + ALT_STANDIN_MARGIN):
    model.alt_standins_skipped += 1  # cannot win: no stand-in compiled
    seconds, extra_s = guess, None
  else:
    seconds = model.step_seconds(costs, run, plan, plan.layout, step.mesh,
                                 step.pipe_axis)
    extra_s = standin_extra(model)
  (seconds,) = _processes.agree([seconds])
  return Priced(name, found, run, plan, float(seconds), extra_s)


def _reprice(step: Any, costs: Any, p: Priced) -> Priced:
  """``p`` priced again on ``CostModel.step_seconds`` (its stand-in figure
  re-timed, ``choice_standins``)."""
  model = step._costs  # pylint: disable=protected-access
  seconds = model.step_seconds(costs, p.unrolled, p.plan, p.plan.layout,
                               step.mesh, step.pipe_axis)
  (seconds,) = _processes.agree([seconds])
  return dataclasses.replace(p, seconds=float(seconds),
                             extra_s=standin_extra(model))


def standin_extra(model: Any) -> float | None:
  """Seconds per kernel call the stand-in of the plan ``model`` priced last
  added (``CostModel.extra_last_s``), or None where that plan's stand-in was not
  timed (not calibrated, a lower bound, a multi-process run). Call it
  right after the pricing whose figure it reads."""
  if not model.calibrated or model.bound_last or model.extra_last_s <= 0:
    return None
  return float(model.extra_last_s)


def _guess_alt(step: Any, costs: Any, run: Any, p: Any,
               extra_s: float | None) -> float | None:
  """Seconds of ``run`` lowered as ``p`` with ``extra_s`` stand-in seconds
  per kernel call (another plan's, :func:`standin_extra`) instead of a
  stand-in of its own; None when ``extra_s`` is None (nothing to estimate
  with)."""
  if extra_s is None:
    return None
  model = step._costs  # pylint: disable=protected-access
  return model.replay_like(costs, run, p, step.mesh, step.pipe_axis,
                           extra_s) + sum(model.serial_seconds(
                               costs, p, p.layout, step.mesh, step.pipe_axis))
