"""Which link model prices a cost model's transfers and FSDP collectives.

:func:`link_model` is the search's (``CostModel.link_model``): the one
given, measured over the pipe axis when asked (``link="measure"``, cached
per machine), else the backend's default. :func:`fsdp_link` is the one
pricing a layout's FSDP collectives (``CostModel.fsdp_link``).
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING, Any

from tessel_jax.cost import cache as _cache
from tessel_jax.cost import link as _link
from tessel_jax.cost import measure as _measure
from tessel_jax.cost import processes as _processes

if TYPE_CHECKING:
  from tessel_jax.cost.model import CostModel

_LOG = logging.getLogger("tessel_jax.cost")


def _from_record(rec: dict[str, Any]) -> _link.LinkModel:
  """A cached link record as a measured :class:`LinkModel`."""
  return _link.LinkModel(rec["latency_s"], rec["bandwidth_bytes_per_s"],
                         "measured")


def _measured_pipe_link(model: CostModel, mesh: Any, pipe_axis: str
                        ) -> _link.LinkModel:
  """The pipe axis's link, from the disk cache or measured (and cached)."""
  device = mesh.devices.flat[0]
  key = _cache.make_key({
      "what": "link", "version": _link.LINK_VERSION,
      "backend": device.platform,
      "device_kind": device.device_kind,
      "devices": int(dict(mesh.shape)[pipe_axis]),
      "xla_flags": _measure.speed_flags()})
  rec = model.cache.get("link", key)
  if rec is not None:
    return _from_record(rec)
  got = _link.measure_link(mesh, pipe_axis)
  model.cache.put("link", key, got.to_dict())
  return got


def link_model(model: CostModel, mesh: Any, pipe_axis: str
               ) -> _link.LinkModel:
  """The link model (chosen once per CostModel, then memoised)."""
  if model.memo.link is not None:
    return model.memo.link
  mesh = _processes.local_mesh(mesh, pipe_axis)
  opt = model.link_option
  if isinstance(opt, _link.LinkModel):
    model.memo.link = opt
  elif opt == "measure" and int(dict(mesh.shape)[pipe_axis]) > 1:
    model.memo.link = _measured_pipe_link(model, mesh, pipe_axis)
  else:
    model.memo.link = _link.default_link(mesh.devices.flat[0].platform)
  return model.memo.link


def _measured_gather_link(model: CostModel, fallback: _link.LinkModel,
                          key: str, mesh: Any, pipe_axis: str,
                          axes: tuple[str, ...]) -> _link.LinkModel:
  """The gather link over ``axes``, from the disk cache or measured (and
  cached); ``fallback`` (logged) where it cannot be timed."""
  rec = model.cache.get("link", key)
  if rec is not None:
    return _from_record(rec)
  t0 = time.perf_counter()
  try:
    got = _link.measure_gather_link(mesh, pipe_axis, axes)
  except Exception as err:  # pylint: disable=broad-except
    _LOG.warning("tessel_jax: FSDP collectives could not be timed"
                 " (%s: %s); priced by the link model",
                 type(err).__name__, err)
    return fallback
  model.cache.put("link", key, got.to_dict())
  model.tally.add(time.perf_counter() - t0, hit=False)
  return got


def fsdp_link(model: CostModel, costs: Any, layout: Any, mesh: Any,
              pipe_axis: str) -> _link.LinkModel:
  """The link pricing ``layout``'s FSDP collectives: measured over its
  data axes (``link.measure_gather_link``, cached per machine) in a
  measured single-process build with a timer, else the search's link
  model (``costs.link``)."""
  axes = tuple(sorted({a for c in layout.classes if c.fsdp
                       for t in c.fsdp for a in t}))
  if (not axes or model.time_outside is None
      or not _processes.single_process()
      or isinstance(model.link_option, _link.LinkModel)):
    return costs.link
  fields = _processes.mesh_fields(mesh, pipe_axis)
  key = _cache.make_key({"what": "gatherlink", "data_axes": list(axes),
                         "version": _link.LINK_VERSION,
                         **fields,
                         "mesh": {str(a): int(n) for a, n in
                                  dict(mesh.shape).items()}})
  if key not in model.memo.gather_links:
    model.memo.gather_links[key] = _measured_gather_link(
        model, costs.link, key, mesh, pipe_axis, axes)
  return model.memo.gather_links[key]
