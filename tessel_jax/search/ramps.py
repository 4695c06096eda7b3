"""Where to cut the steady state: the rotation of a repetend with the
shortest warmup and cooldown.

A repetend of period ``P`` runs block ``b`` of micro-batch ``j`` at
``(k_b + j) P + r_b``. Starting the period ``c`` steps later gives the same
steady state (every action keeps its time) but other offsets and phases
(``rotate``), hence another split of the actions into warmup, full
iterations and cooldown, and other compacted ramps. Only the cuts at a
block's phase change the split (``cut_points``). ``best_rotation``
compacts the ramps of several cuts (``completion.compact_templates``) and
keeps the one whose unrolling is shortest: measured on mllm, 4 devices,
training, N = 128, limit 5 (P = 17): 2181 steps instead of 2183 from the
search's own cut; limit 8 (P = 14): 1797 instead of 1800.
"""

from __future__ import annotations

import dataclasses

from tessel_jax.graph import BlockGraph
from tessel_jax.schedule import SPLIT_MICROBATCHES, Repetend, Schedule
from tessel_jax.search import clock, completion
from tessel_jax.simulate import lower_bound_makespan_shared


def rotate(rep: Repetend, cut: int) -> Repetend:
  """The same steady state with its period starting ``cut`` steps later.

  Every action keeps its step: ``(k + j) P + r = (k' + j) P + r'`` with
  ``r' = (r - cut) mod P``; offsets are shifted to a minimum of 0.
  """
  offsets, phases = [], []
  for k, r in zip(rep.offsets, rep.phases):
    q, phase = divmod(r - cut, rep.period)
    offsets.append(k + q)
    phases.append(phase)
  low = min(offsets)
  return Repetend(rep.period, tuple(k - low for k in offsets), tuple(phases))


#: Most warmup actions (``sum_b K - k_b``) of a cut other than the search's
#: own that ``best_rotation`` compacts: a warmup model of thousands of
#: actions takes seconds to load whatever its time limit (nnshape, 32
#: devices, limit 143: 24 s at 0.05 s), and the cuts pay at small and
#: middle sizes.
MAX_RAMP_ACTIONS = 512


def ramp_size(rep: Repetend) -> int:
  """Warmup actions of ``rep`` (``sum_b K - k_b``; the cooldown has as many)."""
  return sum(rep.max_offset - k for k in rep.offsets)


def cut_points(rep: Repetend,
               max_ramp_actions: int = MAX_RAMP_ACTIONS) -> list[int]:
  """The cuts that give distinct splits: 0 first, then every other phase
  whose warmup has at most ``max_ramp_actions`` actions, fewest first."""
  size = {c: ramp_size(rotate(rep, c)) for c in set(rep.phases) - {0}}
  others = sorted((c for c in size if size[c] <= max_ramp_actions),
                  key=lambda c: (size[c], c))
  return [0] + others


def reference_microbatches(rep: Repetend) -> int:
  """An ``N`` at which every rotation of ``rep`` unrolls with its templates
  (a rotation's largest offset is at most ``K + 1``)."""
  return max(2 * (rep.max_offset + 1) + 2, SPLIT_MICROBATCHES + 1)


def makespan(schedule: Schedule, num_microbatches: int) -> int:
  """Makespan of the unrolling with templates (no list alternative); for
  ``N >= 2K`` it is ``N P`` plus a constant (the ramps do not depend on
  ``N``)."""
  plain = dataclasses.replace(schedule, alternative=None, completer=None)
  return plain.unroll(num_microbatches).makespan


def with_templates(schedule: Schedule, rep: Repetend,
                   templates: completion.Templates) -> Schedule:
  return dataclasses.replace(
      schedule, repetend=rep, warmup=templates.warmup,
      steady_start=templates.steady_start, cooldown=templates.cooldown)


@dataclasses.dataclass(frozen=True)
class Rotation:
  """The best cut ``shortest_rotation`` found.

  Attributes:
    makespan: Its unrolling's makespan at ``reference_microbatches`` of
      the unrotated repetend (``n_ref``).
    repetend: The rotated repetend.
    templates: Its compacted ramps.
    n_ref: The ``N`` of ``makespan``.
    unsolved: The smallest ramp size whose CP-SAT solves found nothing (a
      cut that large or larger gets its modulo schedule pulled in without
      a solve), None if none.
  """

  makespan: int
  repetend: Repetend
  templates: completion.Templates
  n_ref: int
  unsolved: int | None

  def overhead(self) -> int:
    """Steps beyond ``n_ref`` periods (the same at every ``N`` past the
    templates: repetends of one period compare by it)."""
    return self.makespan - self.n_ref * self.repetend.period


def best_rotation(schedule: Schedule, *, per_cut_s: float, max_cuts: int,
                  cap_deadline: float | None = None, seed: int = 0,
                  num_workers: int = 1, refine_s: float = 0.0
                  ) -> tuple[Repetend, completion.Templates]:
  """The rotation of ``schedule.repetend`` with the shortest ramps.

  Args:
    schedule: The searched schedule (its repetend and memory limit).
    per_cut_s: CP-SAT deterministic seconds per cut (warmup and cooldown).
    max_cuts: Most cuts to compact (the first is the search's own cut, so
      1 keeps the old behaviour); a deterministic bound on the work.
    cap_deadline: ``clock.now()`` (CPU seconds of this thread) after
      which no further cut starts (a safety net: ``Budget.cap_deadline``).
    seed, num_workers: CP-SAT settings.
    refine_s: Deterministic seconds of one more compaction of the best
      cut's ramps, once all cuts ran (``refined``); none where it is at
      most ``per_cut_s``.

  Returns:
    The best rotated repetend and its templates (``shortest_rotation``,
    then ``refine_best``).

  Raises:
    completion.CompletionError: if the search's own cut has no ramps under
      the limit (other cuts that fail are skipped).
  """
  best = shortest_rotation(schedule, per_cut_s=per_cut_s, max_cuts=max_cuts,
                           cap_deadline=cap_deadline, seed=seed,
                           num_workers=num_workers)
  best = refine_best(schedule, best, per_cut_s=per_cut_s, refine_s=refine_s,
                     cap_deadline=cap_deadline, seed=seed,
                     num_workers=num_workers)
  return best.repetend, best.templates


def shortest_rotation(schedule: Schedule, *, per_cut_s: float, max_cuts: int,
                      cap_deadline: float | None = None, seed: int = 0,
                      num_workers: int = 1, unsolved: int | None = None
                      ) -> Rotation:
  """The cut of ``schedule.repetend`` whose compacted ramps unroll
  shortest (arguments as ``best_rotation``, no refine; ``unsolved``: a ramp
  size known to be too large for ``per_cut_s``, from another repetend of
  the placement at the same period: see ``Rotation.unsolved``).

  Ties keep the earlier cut. Stops early when a cut reaches
  ``simulate.lower_bound_makespan_shared`` (no schedule is shorter). Once
  CP-SAT found nothing in ``per_cut_s`` for a cut's ramps
  (``Templates.status`` ``MODULO``: its presolve alone spent the time),
  the cuts with ramps at least as large get their modulo schedule pulled
  in without a solve (what CP-SAT returned for the first): nnshape, 8
  devices, limit 30, 292 warmup actions, P = 16: ten cuts, each 0.09
  deterministic s and 0.6 CPU s ending in presolve with the pulled-in
  schedule (the same N = 128 makespan, 2104), now one solve and nine
  pull-ins (cut_points orders the cuts after the first by ramp size).
  The search's own cut is always solved (unless ``unsolved`` says its
  size is too large).
  """
  graph: BlockGraph = schedule.graph
  n_ref = reference_microbatches(schedule.repetend)
  bound = lower_bound_makespan_shared(graph, n_ref)
  best = None
  for n, cut in enumerate(cut_points(schedule.repetend)[:max(1, max_cuts)]):
    if n and cap_deadline is not None and clock.now() > cap_deadline:
      break
    rep = rotate(schedule.repetend, cut)
    size = ramp_size(rep)
    try:
      templates = completion.compact_templates(
          graph, rep, schedule.memory_limit, time_limit_s=per_cut_s,
          seed=seed, num_workers=num_workers,
          solve=unsolved is None or size < unsolved)
    except completion.CompletionError:
      if n == 0:
        raise
      continue
    if templates.status == "MODULO":
      unsolved = size if unsolved is None else min(unsolved, size)
    cost = makespan(with_templates(schedule, rep, templates), n_ref)
    if best is None or cost < best[0]:
      best = (cost, rep, templates)
    if best[0] <= bound:
      break
  return Rotation(best[0], best[1], best[2], n_ref, unsolved)


def refine_best(schedule: Schedule, best: Rotation, *, per_cut_s: float,
                refine_s: float, cap_deadline: float | None = None,
                seed: int = 0, num_workers: int = 1) -> Rotation:
  """``best`` or its ramps compacted again with ``refine_s`` (``refined``),
  whichever unrolls shorter; nothing runs where ``refine_s`` is at most
  ``per_cut_s``, ``best`` meets the lower bound or the CPU cap is past."""
  bound = lower_bound_makespan_shared(schedule.graph, best.n_ref)
  if refine_s <= per_cut_s or best.makespan <= bound or (
      cap_deadline is not None and clock.now() > cap_deadline):
    return best
  cost, rep, templates = refined(
      schedule, (best.makespan, best.repetend, best.templates), refine_s,
      best.n_ref, seed, num_workers)
  return dataclasses.replace(best, makespan=cost, repetend=rep,
                             templates=templates)


def refined(schedule: Schedule, best: tuple, time_limit_s: float, n_ref: int,
            seed: int, num_workers: int) -> tuple:
  """``best`` (``(makespan at n_ref, rotation, templates)``) or its
  rotation's ramps compacted again with ``time_limit_s``, whichever unrolls
  shorter (ties keep ``best``).

  A cut's short solve often stops a step or two above what a longer one
  reaches, and which repetend of a period that favours is noise: nnshape,
  4 devices, limit 13, P = 16, at 0.05 s per cut, CP-SAT's repetend
  unrolled 2068 steps at N = 128 and the constructive scheduler's
  (``modulo_construct``) 2069; at 0.2 s both 2067.
  """
  if best[2].status == "OPTIMAL":
    return best
  rep = best[1]
  try:
    templates = completion.compact_templates(
        schedule.graph, rep, schedule.memory_limit, time_limit_s=time_limit_s,
        seed=seed, num_workers=num_workers)
  except completion.CompletionError:
    return best
  cost = makespan(with_templates(schedule, rep, templates), n_ref)
  return (cost, rep, templates) if cost < best[0] else best
