"""A plan's stand-in program, for one cost model: timed, or skipped.

:func:`standin_seconds` times the plan's stand-in program (memo, disk
cache; ``calibrate``) for ``cost="calibrated"``; :func:`standin_bounds`
says when it need not be timed at all (``CostModel.standin_bounds``).
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING, Any

from tessel_jax.cost import cache as _cache
from tessel_jax.cost import calibrate as _calibrate
from tessel_jax.cost import processes as _processes
from tessel_jax.cost import ticks as _ticks

if TYPE_CHECKING:
  from tessel_jax.cost.model import CostModel

_LOG = logging.getLogger("tessel_jax.cost")


def _fields_and_key(plan: Any, mesh: Any, pipe_axis: str
                    ) -> tuple[dict[str, Any], str]:
  """The cache fields of ``plan``'s stand-in on ``mesh`` and its memo key."""
  fields = _processes.mesh_fields(_processes.local_mesh(mesh, pipe_axis),
                                  pipe_axis)
  fields["mesh"] = {str(a): int(n) for a, n in dict(mesh.shape).items()}
  memo_key = _cache.make_key({"plan": _calibrate.plan_signature(plan),
                              **fields})
  return fields, memo_key


def standin_seconds(model: CostModel, plan: Any, mesh: Any, pipe_axis: str
                    ) -> float | None:
  """Step seconds of ``plan``'s stand-in program (memo, disk cache); None
  (logged) where it cannot be built or run."""
  fields, memo_key = _fields_and_key(plan, mesh, pipe_axis)
  if memo_key not in model.memo.standin:
    t0 = time.perf_counter()
    try:
      sec, hit = _calibrate.cached_standin_seconds(
          plan, model.time_program, model.cache, fields)
    except Exception as err:  # pylint: disable=broad-except
      # The prediction stays usable without it (the microbenchmark's
      # tick model); say why, once per plan.
      _LOG.warning("tessel_jax: the stand-in program of plan %s could not"
                   " be timed (%s: %s); the prediction uses the tick"
                   " microbenchmark only", plan.loop_summary(),
                   type(err).__name__, err)
      model.memo.standin[memo_key] = None
      return None
    model.tally.add(time.perf_counter() - t0, hit=hit)
    model.memo.standin[memo_key] = _processes.agree([sec])[0]
  return model.memo.standin[memo_key]


def replace_seconds(model: CostModel, plan: Any, mesh: Any, pipe_axis: str,
                    seconds: float) -> None:
  """Sets the stand-in seconds of ``plan`` (memo and disk cache): a figure
  timed again side by side with other plans' (``choice_standins``), which
  every later price of ``plan`` then reads."""
  fields, memo_key = _fields_and_key(plan, mesh, pipe_axis)
  model.memo.standin[memo_key] = float(seconds)
  _calibrate.store_standin_seconds(plan, seconds, model.cache, fields)


def standin_bounds(model: CostModel, costs: Any, unrolled: Any, plan: Any,
                   mesh: Any, pipe_axis: str,
                   tick_model: _ticks.TickModel) -> bool:
  """Whether ``plan`` is priced without timing its stand-in: a ceiling is
  set, the stand-in is not known yet (memo or disk cache) and the replay
  with the microbenchmark's tick model alone, a lower bound of the
  calibrated one, is at or above the ceiling."""
  if model.standin_ceiling_s is None:
    return False
  fields, memo_key = _fields_and_key(plan, mesh, pipe_axis)
  if memo_key in model.memo.standin or _calibrate.standin_cached(
      plan, model.cache, fields):
    return False
  bare = model._replay(costs, unrolled, tick_model).step_seconds  # pylint: disable=protected-access
  return bare >= model.standin_ceiling_s
