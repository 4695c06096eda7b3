"""A lowered schedule's prediction, its ticks priced, for one cost model.

:func:`tick_costs` measures the lowering's per-tick costs once
(``ticks``); :func:`tick_model` prices a plan's ticks with them (and the
machine's per-port seconds, ``port_pricing``); :func:`replay` replays the
schedule with the measured kernels (``predict``); :func:`predict` adds what
the plan's stand-in program pays beyond the tick model
(``cost="calibrated"``, ``calibrate``): ``CostModel.predict``.
"""

from __future__ import annotations

import dataclasses
import time
from typing import TYPE_CHECKING, Any

from tessel_jax.cost import calibrate as _calibrate
from tessel_jax.cost import port_pricing as _port_pricing
from tessel_jax.cost import predict as _predict
from tessel_jax.cost import processes as _processes
from tessel_jax.cost import ticks as _ticks

if TYPE_CHECKING:
  from tessel_jax.cost.model import CostModel


def tick_costs(model: CostModel, mesh: Any, pipe_axis: str
               ) -> _ticks.TickCosts:
  """Per-tick costs of the lowering on this mesh (microbenchmark, cached;
  measured once per CostModel)."""
  if model.memo.ticks is None:
    mesh = _processes.local_mesh(mesh, pipe_axis)
    fields = _processes.mesh_fields(mesh, pipe_axis)
    t0, hits = time.perf_counter(), model.cache.hits
    model.memo.ticks = _ticks.cached_tick_costs(mesh, pipe_axis, model.cache,
                                                fields)
    # part of profiling
    model.tally.add(time.perf_counter() - t0, hit=model.cache.hits > hits)
  return model.memo.ticks


def tick_model(model: CostModel, costs: Any, unrolled: Any, plan: Any,
               mesh: Any, pipe_axis: str) -> _ticks.TickModel:
  """The microbenchmark's tick model of ``plan`` (per-port seconds
  included unless ``cost="calibrated"``), before any stand-in."""
  device = mesh.devices.flat[0]
  rendezvous = device.platform in _ticks.RENDEZVOUS_BACKENDS
  tc = model.tick_costs(mesh, pipe_axis)
  if costs.shared_cores is not None and costs.stage_devices > 1:
    # CPU: the ticks' core-seconds are one device's; a pipe device of
    # the replay is a stage of ``stage_devices`` devices, each paying them.
    g = costs.stage_devices
    tc = dataclasses.replace(tc, fixed_s=g * tc.fixed_s,
                             per_byte_s=g * tc.per_byte_s)
  if not model.calibrated:  # else the plan's own stand-in prices ticks
    tc = _port_pricing.priced(tc, *model.port_seconds(
        costs, unrolled, plan, mesh, pipe_axis, tc))
  return _ticks.tick_model(plan, costs.link, tc, rendezvous=rendezvous)


def replay(costs: Any, unrolled: Any, model: _ticks.TickModel,
           idle: bool = False) -> _predict.Prediction:
  """Replays ``unrolled`` with the measured kernels (``idle``: with
  zero-time kernels) and tick model ``model``'s costs."""
  q = costs.quantized
  kw = dict(delays=model.delays(q.delay_seconds),
            memory_bytes=q.memory_bytes, barriers=model.barriers,
            tick_seconds=model.tick_seconds,
            barriers_after=model.barriers_after)
  if costs.shared_cores is not None:
    work = ({b: 0.0 for b in costs.work} if idle else costs.work)
    return _predict.predict_shared(unrolled, work, costs.parallelism,
                                   costs.shared_cores, **kw)
  seconds = {b: 0.0 for b in q.seconds} if idle else dict(q.seconds)
  return _predict.predict(unrolled, seconds, **kw)


def _with_standin(model: CostModel, costs: Any, unrolled: Any, plan: Any,
                  mesh: Any, pipe_axis: str, standin: float,
                  base: _ticks.TickModel) -> _ticks.TickModel:
  """``base`` plus, per kernel call, its share of what the stand-in's
  ticks (its step less the serial part, which ``step_seconds`` adds
  itself) pay beyond ``base`` (``calibrate.extra_tick_seconds``)."""
  ticks_s = standin - sum(model.serial_seconds(costs, plan, plan.layout,
                                               mesh, pipe_axis))
  calls = _ticks.kernel_calls(plan)
  extra = _calibrate.extra_tick_seconds(
      ticks_s, lambda x: model._replay(  # pylint: disable=protected-access
          costs, unrolled, base.plus_calls(x, calls), idle=True
      ).step_seconds)
  model.extra_last_s = extra
  return base.plus_calls(extra, calls)


def predict(model: CostModel, costs: Any, unrolled: Any, plan: Any,
            mesh: Any, pipe_axis: str
            ) -> tuple[_predict.Prediction, _ticks.TickModel]:
  """The measured prediction of a lowered schedule and its tick model
  (``CostModel.predict``)."""
  tm = model._tick_model(costs, unrolled, plan, mesh, pipe_axis)  # pylint: disable=protected-access
  model.bound_last = False
  model.extra_last_s = 0.0
  calibrate = (model.calibrated and model.time_program is not None
               and _processes.single_process())
  if calibrate and model.standin_bounds(costs, unrolled, plan, mesh,
                                        pipe_axis, tm):
    model.bound_last = True
    model.standins_skipped += 1
    return model._replay(costs, unrolled, tm), tm  # pylint: disable=protected-access
  standin = (model._standin_seconds(plan, mesh, pipe_axis)  # pylint: disable=protected-access
             if calibrate else None)
  if standin is not None:
    tm = _with_standin(model, costs, unrolled, plan, mesh, pipe_axis,
                       standin, tm)
  return model._replay(costs, unrolled, tm), tm  # pylint: disable=protected-access


def replay_like(model: CostModel, costs: Any, unrolled: Any, plan: Any,
                mesh: Any, pipe_axis: str, extra_s: float) -> float:
  """Seconds of ``unrolled`` lowered as ``plan``, its ticks priced by the
  tick model plus ``extra_s`` per kernel call (``CostModel.replay_like``)."""
  tm = model._tick_model(costs, unrolled, plan, mesh, pipe_axis)  # pylint: disable=protected-access
  return model._replay(costs, unrolled, tm.plus_calls(  # pylint: disable=protected-access
      extra_s, _ticks.kernel_calls(plan))).step_seconds
