"""What decides a frontier's prices: its memo key and its disk-cache key.

:func:`program_key` keys the priced plans of this process
(``FrontierFunction.program_key``); :func:`disk_key` keys the whole
frontier on disk (``frontier_cache``).
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

import jax

from tessel_jax import frontier_cache as _frontier_cache
from tessel_jax.frontier_cache import FrontierCache

if TYPE_CHECKING:
  from tessel_jax.plans import FrontierFunction


def program_key(ff: FrontierFunction, params: Any, batch: Any) -> Any:
  """What decides every price: the function, input shapes, mesh and
  options (None when the function is not hashable: no memo)."""
  leaves = jax.tree_util.tree_leaves((params, batch))
  mesh = ff.mesh
  key = (ff.fn, jax.tree_util.tree_structure((params, batch)),
         tuple((tuple(x.shape), str(x.dtype)) for x in leaves),
         tuple(mesh.axis_names), tuple(dict(mesh.shape).items()),
         tuple(int(d.id) for d in mesh.devices.flat), ff.mode,
         ff.pipe_axis, repr(sorted(ff.schedule_kw.items())),
         ff.price_stash, ff.paired_standins)
  try:
    hash(key)
  except TypeError:
    return None
  return key


def _options(ff: FrontierFunction) -> dict[str, Any]:
  """The options a frontier on disk is keyed on (``cache_dir`` aside)."""
  options = {k: v for k, v in ff.schedule_kw.items() if k != "cache_dir"}
  options.update(
      placements=ff.names, microbatches=ff.microbatches,
      memory_limit=ff.memory_limit, baselines=ff.baselines,
      pipe_axis=ff.pipe_axis, mode=ff.mode, refine=ff.refine,
      prune=ff.prune, screen_time_limit_s=ff.screen_time_limit_s,
      screen_estimate=ff.screen_estimate,
      refine_margin=ff.refine_margin)
  if ff.price_stash:  # absent when off: earlier keys stay valid
    options.update(price_stash=True)
  if ff.paired_standins:  # absent when off: earlier keys stay valid
    options.update(paired_standins=True)
  if ff.screen_prune:  # absent when off: earlier keys stay valid
    options.update(screen_prune=True)
  return options


def disk_key(ff: FrontierFunction, traced: Any, params: Any, batch: Any
             ) -> tuple[FrontierCache, str] | None:
  """``(cache, key)`` of ``ff``'s frontier on disk; None when it is not
  cached there (``disk_cache=False``, ``reprofile=True``, uniform costs,
  or the program did not trace)."""
  cost = ff.schedule_kw.get("cost") or os.environ.get(
      _frontier_cache.COST_ENV, "measured")
  if (not ff.disk_cache or traced is None or cost == "uniform" or
      ff.schedule_kw.get("reprofile")):
    return None
  key = _frontier_cache.frontier_key(
      _frontier_cache.program_digest(traced), params, batch, ff.mesh,
      _options(ff))
  return FrontierCache(ff.schedule_kw.get("cache_dir")), key
