"""The part of a step run serially with its ticks, for one cost model.

:func:`outside_seconds` times the packing and unpacking around the ticks
(``cost.outside``, once per program shape and machine);
:func:`serial_seconds` adds the FSDP collectives (``passes.fsdp_comm``,
priced by ``link_choice.fsdp_link``): ``CostModel.serial_seconds``.
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING, Any

from tessel_jax.cost import cache as _cache
from tessel_jax.cost import outside as _outside
from tessel_jax.cost import processes as _processes

try:  # installed: passes/ is tessel_jax.passes
  from tessel_jax.passes import fsdp_comm as _fsdp_comm  # type: ignore
except ImportError:  # run from the repository root
  from passes import fsdp_comm as _fsdp_comm  # type: ignore

if TYPE_CHECKING:
  from tessel_jax.cost.model import CostModel

_LOG = logging.getLogger("tessel_jax.cost")


def outside_seconds(model: CostModel, layout: Any, mesh: Any,
                    pipe_axis: str) -> float:
  """Seconds of the step's packing and unpacking around its ticks
  (measured once per program shape and machine, cached); 0 where the
  build gives no timer (screening builds, multi-process runs)."""
  if model.time_outside is None or not _processes.single_process():
    return 0.0
  try:
    got = model.time_outside(layout)
    if got is None:
      return 0.0
    signature, measure = got.signature, got.measure
    fields = _processes.mesh_fields(
        _processes.local_mesh(mesh, pipe_axis), pipe_axis)
    memo_key = _cache.make_key({"program": signature, **fields})
    if memo_key in model.memo.outside:
      return model.memo.outside[memo_key]
    t0 = time.perf_counter()
    sec, hit = _outside.cached_outside_seconds(model.cache, fields,
                                               signature, measure)
  except Exception as err:  # pylint: disable=broad-except
    # The prediction stays usable without it; say why.
    _LOG.warning("tessel_jax: the packing and unpacking around the ticks"
                 " could not be timed (%s: %s); the prediction leaves"
                 " them out", type(err).__name__, err)
    return 0.0
  if not hit:
    model.tally.add(time.perf_counter() - t0, hit=False)
  model.memo.outside[memo_key] = sec
  return sec


def serial_seconds(model: CostModel, costs: Any, plan: Any, layout: Any,
                   mesh: Any, pipe_axis: str) -> tuple[float, float]:
  """``(FSDP, outside)`` seconds of ``plan`` on ``layout`` run serially
  with its ticks."""
  link = model.fsdp_link(costs, layout, mesh, pipe_axis)
  return (_fsdp_comm.seconds(layout, plan, link),
          model.outside_seconds(layout, mesh, pipe_axis))
