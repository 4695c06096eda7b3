"""``tj.frontier``: every plan of a user's program, priced, and the choice.

::

    fr = tj.frontier(loss_fn, mesh=tj.cpu_mesh(4))(params, batch)
    print(fr)                       # every plan: step, peak, Pareto set
    fr.plot("frontier.png")
    best = fr.choose(memory_limit=2**30)    # what placement="auto" takes

A *plan* is a named placement that fits the devices per pipeline, a
data-parallel width (the mesh's data axes, or a ``pipe x data``
factorisation of a 1-D mesh), a micro-batch count and a schedule (searched,
or a classic baseline that fits the placement). Each is priced by building
it (``ScheduledFunction.build``: trace, cut at the placement's block count
- at the ``tj.boundary`` markers when their count fits, else automatically -,
profile, search, plan the lowering; nothing is compiled): its predicted
step time and per-device peak bytes come from ``step.report``. The cost
model object is shared, so a kernel measured for one plan is reused by
every plan that contains it (and the disk cache keeps it for the next
process).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

import jax

from tessel_jax import frontier_keys as _frontier_keys
from tessel_jax import frontier_limited as _frontier_limited
from tessel_jax import frontier_memo as _frontier_memo
from tessel_jax import frontier_price as _frontier_price
from tessel_jax import frontier_refine as _frontier_refine
from tessel_jax import frontier_speculate as _frontier_speculate
from tessel_jax import frontier_step as _frontier_step
from tessel_jax import frontier_sweep as _frontier_sweep
from tessel_jax import paired_standins as _paired_standins
from tessel_jax import placements as _placements
from tessel_jax import plan_pricing as _plan_pricing
from tessel_jax.cost import estimate as _estimate
from tessel_jax.cost import stash_fill as _stash_fill
from tessel_jax.frontier_cache import FrontierCache
from tessel_jax.frontier_refine import full_scale  # noqa: F401
# The pieces, re-exported: tessel_jax.plans stays the one import for users.
from tessel_jax.frontier_result import (Candidate, PricedPlan,  # noqa: F401
                                        ProgramFrontier, choose_index,
                                        pareto, shape_of)
from tessel_jax.plan_candidates import (base_of, candidates,  # noqa: F401
                                        frozen, microbatch_counts, submesh,
                                        widths, with_limit)
from tessel_jax.plan_pricing import (Pruned, baseline_price,  # noqa: F401
                                     count_blocks, marker_blocks, replay,
                                     step_lower_bound, trace_markers)

#: Placements tried by default (every named one; those that do not fit a
#: pipeline width are skipped with the reason).
DEFAULT_PLACEMENTS = tuple(_placements.PLACEMENTS)


#: Priced plans of this process (``frontier_memo``; the same objects).
_MEMO = _frontier_memo.MEMO
MEMO_SIZE = _frontier_memo.MEMO_SIZE
clear_memo = _frontier_memo.clear


class FrontierFunction:
  """``tj.frontier(fn, ...)``: call it with ``(params, batch)``.

  With ``refine=k`` the searched plans are first *screened*: built without
  the second search on uniform spans (``ScheduledFunction.screening``),
  then the ``k`` fastest screened plans that fit the memory limit, and
  whichever fitting plan is fastest after that, are built in full (the
  full build's step is at most the screened one); ``refine=None`` builds
  every plan in full.

  ``screen_time_limit_s`` and ``screen_estimate`` make screening cheaper
  instead: a screening build then runs both searches, but with a CP-SAT
  budget of at most ``screen_time_limit_s`` (a search that needs the whole
  budget is cut short; the full build searches again with the caller's
  budget), and with ``screen_estimate`` every kernel not measured yet is
  estimated from its flops (``cost.estimate.KernelEstimator``, calibrated
  on the kernels measured so far; the first plan is measured to start it)
  instead of compiled and timed. Only the plans refined are then measured
  in full. Screened prices do not prune (an estimate is not a measurement)
  and leave out the kernel workspace (known once compiled). With
  ``refine_margin=m`` every fitting screened plan whose price is below
  ``(1 + m)`` times the fastest fitting full build is built in full too
  (a screened price may be off either way). With ``screen_prune=True``
  (and ``prune``, ``screen_estimate``) a searched plan whose lower bound on
  its screening's kernels (estimated ones included, so on the screened
  prices' scale) is at least ``(1 + m)`` times the fastest fitting
  screened price so far is not searched, nor its classic schedules
  priced: its screened price is at least its bound, so the refine would
  not build it in full (unless the full builds' scale, ``full_scale``,
  moves the plans built both ways apart by more than the margin).

  With ``prune=True`` a plan whose lower bound (:func:`step_lower_bound`,
  from its measured kernels, before any search) is no faster than the
  fastest fitting plan priced so far is skipped (and its classic baselines
  with it: same kernels, same bound); the widest data parallelism is
  priced first.

  With ``price_stash=True`` (``placement="auto"`` sets it:
  ``auto.PRICE_STASH``) a classic schedule priced on a searched plan's
  build also pays for the stash bytes it holds beyond that plan's
  (``plan_pricing.baseline_price``, ``cost.stash_fill``; measured once per
  process, ~1-2 s).

  With ``paired_standins=True`` (``placement="auto"``:
  ``auto.PAIRED_STANDINS``) the two close leaders priced on different
  stand-in programs are re-priced from a side-by-side timing of their
  stand-ins (``paired_standins.recheck``).

  The result can depend on what this process priced before: the plans of
  the same program, shapes, mesh and options are remembered
  (``frontier_memo``), and the plans another call searched under another
  memory limit are added when they fit this one
  (``frontier_limited.limited_plans``): only full builds that fit, so a
  later call may list more plans and choose a faster one, never one over
  its limit.
  """

  def __init__(self, fn: Callable[..., Any], *, mesh: Any,
               placements: Sequence[str] | None = None,
               microbatches: Sequence[int] | None = None,
               memory_limit: int | None = None, baselines: bool = True,
               pipe_axis: str = "pipe", mode: str = "train",
               refine: int | None = None, prune: bool = False,
               screen_time_limit_s: float | None = None,
               screen_estimate: bool = False, refine_margin: float = 0.0,
               disk_cache: bool = True, price_stash: bool = False,
               paired_standins: bool = False, screen_prune: bool = False,
               **schedule_kw: Any):
    self.fn, self.mesh, self.pipe_axis, self.mode = fn, mesh, pipe_axis, mode
    self.price_stash = price_stash
    self.paired_standins = paired_standins
    self.disk_cache = disk_cache
    self.names = tuple(placements or DEFAULT_PLACEMENTS)
    self.microbatches = (None if microbatches is None else
                         tuple(int(n) for n in microbatches))
    self.memory_limit = memory_limit
    self.baselines = baselines
    self.refine = refine
    self.prune = prune
    self.screen_time_limit_s = screen_time_limit_s
    self.screen_estimate = screen_estimate
    self.refine_margin = float(refine_margin)
    self.screen_prune = screen_prune
    self.estimator = _estimate.KernelEstimator() if screen_estimate else None
    self.schedule_kw = schedule_kw
    self.costs: Any = None  # the CostModel shared by every candidate
    self.steps: dict[Candidate, Any] = {}  # priced ScheduledFunctions
    self.memo_hits = 0
    self.disk_hits = 0  # frontiers read back from the disk cache
    self.markers: int | None = None  # blocks of fn's markers (last call)
    self.pruned = 0  # plans not searched: lower bound >= best so far
    self._best_ms: float | None = None
    self._best_screened_ms: float | None = None  # estimated kernels
    self._key: Any = None
    self._fronts: dict[Any, dict[Any, Any]] = {}  # see step_for
    self._searched_replays = _plan_pricing.SearchedReplays()

  def __call__(self, params: Any, batch: Any) -> ProgramFrontier:
    t0 = time.perf_counter()
    traced = trace_markers(self.fn, params, batch, self.schedule_kw)
    markers = self.markers = count_blocks(traced)
    self._key = self.program_key(params, batch)
    disk = self._disk_key(traced, params, batch)
    if disk is not None:
      stored = disk[0].load(disk[1])
      if stored is not None:
        self.disk_hits += 1
        return stored
    fr = self._price_frontier(params, batch, markers, t0)
    if disk is not None:
      disk[0].store(disk[1], fr)
    return fr

  def _price_frontier(self, params: Any, batch: Any, markers: int | None,
                      t0: float) -> ProgramFrontier:
    """Prices every candidate (screened, then refined, when asked)."""
    skipped: list[tuple[str, str]] = []
    rows = int(jax.tree_util.tree_leaves(batch)[0].shape[0])
    todo = candidates(self.mesh, self.pipe_axis, rows, self.mode, self.names,
                      self.microbatches, self.baselines,
                      lambda w, y: skipped.append((w, y)))
    priced = self._price_all(todo, params, batch, markers, skipped)
    if self.refine is not None:
      try:
        self._refine(priced, params, batch, markers, skipped)
      finally:
        _frontier_speculate.finish()
    # The plans searched under other limits in this process that fit this
    # one: the choice is the fastest of every plan priced (so the result
    # depends on what the process priced before: see frontier_limited).
    priced += _frontier_limited.limited_plans(
        self, {p.candidate for p in priced})
    if self.paired_standins:
      priced = _paired_standins.recheck(priced, self.steps, params, batch,
                                        self.memory_limit, self._key)
    name = getattr(self.fn, "__name__", type(self.fn).__name__)
    return ProgramFrontier(fn_name=name, plans=tuple(priced),
                           pareto=pareto(priced), skipped=tuple(skipped),
                           seconds=time.perf_counter() - t0)

  def _disk_key(self, traced: Any, params: Any, batch: Any
                ) -> tuple[FrontierCache, str] | None:
    """``(cache, key)`` of this frontier on disk; None when it is not
    cached there (``frontier_keys.disk_key``)."""
    return _frontier_keys.disk_key(self, traced, params, batch)

  def program_key(self, params: Any, batch: Any) -> Any:
    """What decides every price: the function, input shapes, mesh and
    options (None when the function is not hashable: no memo;
    ``frontier_keys.program_key``)."""
    return _frontier_keys.program_key(self, params, batch)

  def _price_all(self, todo: Sequence[Candidate], params: Any, batch: Any,
                 markers: int | None,
                 skipped: list[tuple[str, str]]) -> list[PricedPlan]:
    """Prices every candidate (screened when ``refine`` is set;
    ``frontier_sweep.price_all``)."""
    return _frontier_sweep.price_all(self, todo, params, batch, markers,
                                     skipped)

  def _note_best(self, p: PricedPlan) -> None:
    """Remembers the fastest fitting measured plan (for pruning), and the
    fastest fitting screened one (for ``screen_prune``)."""
    if p.unit != "ms" or (self.memory_limit is not None and
                          p.peak_bytes > self.memory_limit):
      return
    if p.screened and self.screen_estimate:
      # Estimated kernels: no bound to prune measured plans with.
      if self._best_screened_ms is None or p.step < self._best_screened_ms:
        self._best_screened_ms = p.step
    elif self._best_ms is None or p.step < self._best_ms:
      self._best_ms = p.step

  def _check_bound(self, c: Candidate, bound_ms: float) -> None:
    """Raises :class:`Pruned` when ``c`` cannot beat the best so far."""
    if self._best_ms is not None and bound_ms >= self._best_ms:
      self.pruned += 1
      raise Pruned(f"lower bound {bound_ms:.3f} ms >= {self._best_ms:.3f} ms"
                   f" of the fastest plan priced so far")

  def _check_screened_bound(self, c: Candidate, bound_ms: float) -> None:
    """Raises :class:`Pruned` when ``c``'s screening bound (estimated
    kernels) is at least ``1 + refine_margin`` times the fastest fitting
    screened price so far: its screened price would be too, so the refine
    would not build it in full (``screen_prune``)."""
    best = self._best_screened_ms
    limit = None if best is None else (1.0 + self.refine_margin) * best
    if limit is not None and bound_ms >= limit:
      self.pruned += 1
      raise Pruned(f"screening lower bound {bound_ms:.3f} ms >= (1 +"
                   f" {self.refine_margin:g}) x {best:.3f} ms, the fastest"
                   f" screened plan so far")

  def _refine(self, priced: list[PricedPlan], params: Any, batch: Any,
              markers: int | None,
              skipped: list[tuple[str, str]] | None = None) -> None:
    """Builds the screened plans worth it in full, in place
    (``frontier_refine.refine``)."""
    _frontier_refine.refine(self, priced, params, batch, markers, skipped)

  def step_for(self, c: Candidate, markers: int | None = None,
               screen: bool = False) -> Any:
    """The ``ScheduledFunction`` of candidate ``c`` (shared cost model;
    ``screen``: a screening build, see the class doc;
    ``frontier_step.step_for``)."""
    return _frontier_step.step_for(self, c, markers, screen)

  @property
  def cheap_screening(self) -> bool:
    """Screening builds run both searches on a shorter budget and/or
    estimated kernels (else they skip the uniform-span search)."""
    return self.screen_estimate or self.screen_time_limit_s is not None

  @property
  def full_time_limit_s(self) -> float:
    """The CP-SAT budget of a full build."""
    given = self.schedule_kw.get("solver_time_limit_s")
    if given is None:
      import inspect  # pylint: disable=import-outside-toplevel
      from tessel_jax import api  # pylint: disable=import-outside-toplevel
      given = inspect.signature(api.schedule).parameters[
          "solver_time_limit_s"].default
    return float(given)

  def _screen_tag(self, screen: bool) -> Any:
    """What a screening build is, for the memo (False: a full build)."""
    if not screen:
      return False
    if not self.cheap_screening:
      return True
    return ("cheap", self.screen_time_limit_s, self.screen_estimate)

  def price(self, c: Candidate, params: Any, batch: Any,
            markers: int | None = None, screen: bool = False,
            ceiling: bool = True) -> PricedPlan:
    """Builds candidate ``c`` and reads its price (remembered per process,
    see ``frontier_memo``; ``frontier_price.price``); ``ceiling=False``:
    never a lower bound (its stand-in is timed, see
    :meth:`_standin_ceiling`)."""
    return _frontier_price.price(self, c, params, batch, markers, screen,
                                 ceiling)

  def _standin_ceiling(self, screen: bool) -> float | None:
    """Seconds at or above which a full build's plan is priced by its
    lower bound instead of timing its stand-in program (with ``prune``:
    the fastest fitting plan priced so far; see ``PricedPlan.bound``)."""
    if not self.prune or screen or self._best_ms is None:
      return None
    return self._best_ms / 1e3

  def price_baseline(self, c: Candidate, base: PricedPlan) -> PricedPlan:
    """A classic schedule priced on the searched plan ``base`` of the same
    placement, width and N (``plan_pricing.baseline_price``)."""
    step = self.steps[base.candidate]
    replay_run = getattr(step, "replay_run", None)
    base_s = (None if replay_run is None or base.unit != "ms" else
              self._searched_replays(step.built, replay_run))
    per_byte = (_stash_fill.measure_seconds_per_byte()
                if self.price_stash and base.unit == "ms" else None)
    return baseline_price(step.built, c, base, replay_run, base_s, per_byte)

  def _baseline(self, c: Candidate, base: PricedPlan, params: Any,
                batch: Any, markers: int | None) -> PricedPlan:
    """:meth:`price_baseline`; scaled from a lower bound (``base.bound``)
    to below the fastest fitting plan so far, it could win on a price never
    calibrated, so ``base`` is then priced in full first."""
    p = self.price_baseline(c, base)
    if p.bound and (self._best_ms is None or p.step < self._best_ms):
      base = self.price(base.candidate, params, batch, markers,
                        ceiling=False)
      p = self.price_baseline(c, base)
    return p


def frontier(fn: Callable[..., Any] | None = None, *, mesh: Any,
             placements: Sequence[str] | None = None,
             microbatches: Sequence[int] | None = None,
             memory_limit: int | None = None, baselines: bool = True,
             pipe_axis: str = "pipe", mode: str = "train",
             refine: int | None = None,
             screen_time_limit_s: float | None = None,
             screen_estimate: bool = False, refine_margin: float = 0.0,
             **schedule_kw: Any) -> Any:
  """Every plan of ``fn`` on ``mesh``, priced; call the result with
  ``(params, batch)`` to get a :class:`ProgramFrontier`.

  Args:
    fn: ``fn(params, microbatch)`` as for ``tj.schedule``.
    mesh: The mesh (a 1-D pipe axis is also tried as ``pipe x data``).
    placements: Placement names to try (default: every named one).
    microbatches: Micro-batch counts to try (default: divisors of the batch
      rows giving ``pipe .. 4 pipe`` per pipeline).
    memory_limit: Bytes per device: searched plans are also priced under it.
    baselines: Also price the classic schedules that fit each placement.
    pipe_axis: The mesh's pipe axis.
    mode: ``"train"`` or ``"infer"``.
    refine: None (build every plan in full) or ``k``: screen every plan,
      then build the ``k`` fastest that fit in full (see
      :class:`FrontierFunction`).
    screen_time_limit_s: With ``refine``: the CP-SAT budget of a screening
      build (both searches run; see :class:`FrontierFunction`).
    screen_estimate: With ``refine``: screening builds estimate the kernels
      not measured yet from their flops instead of compiling them.
    refine_margin: With ``refine``: also build in full every screened plan
      priced within this fraction of the fastest full build.
    **schedule_kw: Other ``tj.schedule`` options (``cost``, ``recompute``,
      ``optimizer_slots``, ``solver_time_limit_s``, ...).

  The plans priced are remembered for the process: a later call for the
  same program may list more plans (those searched under another memory
  limit that fit this one) and choose a faster one; see
  :class:`FrontierFunction`.
  """
  def make(f: Callable[..., Any]) -> FrontierFunction:
    return FrontierFunction(f, mesh=mesh, placements=placements,
                            microbatches=microbatches,
                            memory_limit=memory_limit, baselines=baselines,
                            pipe_axis=pipe_axis, mode=mode, refine=refine,
                            screen_time_limit_s=screen_time_limit_s,
                            screen_estimate=screen_estimate,
                            refine_margin=refine_margin, **schedule_kw)
  return make if fn is None else make(fn)



__all__ = [
    "Candidate", "DEFAULT_PLACEMENTS", "FrontierFunction", "PricedPlan",
    "ProgramFrontier", "Pruned", "base_of", "baseline_price", "candidates",
    "choose_index", "clear_memo", "frontier", "frozen", "full_scale",
    "marker_blocks",
    "microbatch_counts", "pareto", "replay", "shape_of", "step_lower_bound",
    "submesh", "widths", "with_limit",
]
