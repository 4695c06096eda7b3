"""One candidate plan's ``ScheduledFunction`` inside ``tj.frontier``.

``FrontierFunction.step_for`` builds it here: the placement's graph, the
cut (automatic where the markers' count does not fit), the sub-mesh of the
``pipe x data`` factorisation, a screening build's cheaper options, the
front (trace, cut, kernels) shared with the other builds of the same
placement, width and N, the lower-bound hook that prunes it, and the cost
model shared by every candidate.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from tessel_jax import frontier_memo as _frontier_memo
from tessel_jax import placements as _placements
from tessel_jax.frontier_result import Candidate
from tessel_jax.plan_candidates import submesh
from tessel_jax.plan_pricing import step_lower_bound

if TYPE_CHECKING:
  from tessel_jax.plans import FrontierFunction


def schedule_options(ff: FrontierFunction, c: Candidate,
                     markers: int | None, cheap: bool) -> dict[str, Any]:
  """``tj.schedule`` keywords of ``c`` beyond the placement and plan: the
  caller's, an automatic cut where ``fn``'s markers do not give the
  placement's block count, a cheap screening's CP-SAT budget, and the data
  axis of a ``pipe x data`` factorisation made here."""
  graph = _placements.get(c.placement, c.pipe, mode=ff.mode)
  count = sum(1 for b in graph.blocks if b.kind == "F")
  kw = dict(ff.schedule_kw)
  if markers is not None and markers != count and kw.get("cut") is None:
    kw["cut"] = "auto"
  if cheap and ff.screen_time_limit_s is not None:
    kw["solver_time_limit_s"] = min(ff.screen_time_limit_s,
                                    ff.full_time_limit_s)
  if (submesh(ff.mesh, c.pipe, c.dp, ff.pipe_axis) is not ff.mesh
      and kw.get("data_axes") is None):
    kw["data_axes"] = ("data",)
  return kw


def bound_hook(ff: FrontierFunction, c: Candidate,
               cheap: bool) -> Callable[[Any, int], None] | None:
  """The ``price_bound`` hook that prunes ``c`` from its kernels' lower
  bound before any search (None: ``c`` is not pruned).

  A measured bound (``prune``; not a cheap screening on estimated kernels)
  is remembered per program (``frontier_memo.remember_bound``) and checked
  against the fastest fitting plan; an estimated one (``screen_prune``) is
  checked against the fastest screened price and not remembered.
  """
  if not ff.prune or c.plan is not None:
    return None
  estimated = cheap and ff.screen_estimate
  if not estimated:
    def measured(costs: Any, n_local: int) -> None:
      ms = step_lower_bound(costs, n_local) * 1e3
      if ff._key is not None:  # pylint: disable=protected-access
        _frontier_memo.remember_bound(ff._key, c, ms)  # pylint: disable=protected-access
      ff._check_bound(c, ms)  # pylint: disable=protected-access
    return measured
  if not ff.screen_prune:
    return None

  def screened(costs: Any, n_local: int) -> None:
    ff._check_screened_bound(c, step_lower_bound(costs, n_local) * 1e3)  # pylint: disable=protected-access
  return screened


def step_for(ff: FrontierFunction, c: Candidate, markers: int | None,
             screen: bool) -> Any:
  """The ``ScheduledFunction`` of ``c`` (see ``FrontierFunction.step_for``),
  recorded in ``ff.steps``."""
  from tessel_jax import api  # pylint: disable=import-outside-toplevel
  cheap = screen and ff.cheap_screening
  step = api.schedule(
      ff.fn, mesh=submesh(ff.mesh, c.pipe, c.dp, ff.pipe_axis),
      placement=_placements.get(c.placement, c.pipe, mode=ff.mode),
      num_microbatches=c.microbatches, mode=ff.mode, plan=c.plan,
      memory_limit=c.memory_limit, pipe_axis=ff.pipe_axis,
      **schedule_options(ff, c, markers, cheap))
  step.screening = screen and not cheap  # skips the uniform-span search
  step.keep_standins = ff.paired_standins  # paired_standins.recheck
  if ff._key is not None:  # pylint: disable=protected-access
    # One trace, cut and kernel set per placement, width and N: shared by
    # the screening build, the full one, those under a memory limit and
    # the classic schedules (tessel_jax.step_build.shared).
    step.shared_front = ff._fronts.setdefault(  # pylint: disable=protected-access
        (ff._key, c.placement, c.pipe, c.dp, c.microbatches), {})  # pylint: disable=protected-access
  # A cheap screening build runs both searches but does not calibrate the
  # tick model on a compiled stand-in program (tessel_jax.step_build).
  step.cheap_screening = cheap
  hook = bound_hook(ff, c, cheap)
  if hook is not None:
    step.price_bound = hook
  if ff.costs is None:
    ff.costs = step._costs  # pylint: disable=protected-access
  step._costs = ff.costs  # pylint: disable=protected-access
  ff.steps[c] = step
  return step
