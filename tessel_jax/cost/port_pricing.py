"""The machine's seconds per port operation, for one :class:`CostModel`.

``cost.ports`` says what the figure is and how it is solved; this module
wires it to a cost model: read from the disk cache, else measured on the
stand-in program of the first reference plan a build prices
(``CostModel.time_program``), and priced into the tick costs in one place
(:func:`priced`).

What the stand-in program's step holds beyond its ticks: the packing and
unpacking around them and any FSDP collectives (``CostModel.serial_seconds``),
which every prediction adds to the replay of the ticks itself. Until
``ports.PORTS_VERSION`` 7 the solve gave the ticks the stand-in's whole
step, so the outside was paid twice in every measured prediction: on the
reference batch-norm CNN (2 CPU devices, ``vshape(2)``, N = 8) 0.3-0.5 ms of
a 2.2 ms stand-in, whose ticks, zero-time kernels, price 0.9 ms: the
per-port figure came out 1.3-1.6x what the ports cost.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from typing import Any, NamedTuple

from tessel_jax.cost import cache as _cache
from tessel_jax.cost import calibrate as _calibrate
from tessel_jax.cost import ports as _ports
from tessel_jax.cost import processes as _processes
from tessel_jax.cost import ticks as _ticks

_LOG = logging.getLogger("tessel_jax.cost")


def priced(tick_costs: _ticks.TickCosts, per_port_s: float
           ) -> _ticks.TickCosts:
  """``tick_costs`` with ``per_port_s`` per port operation and every tick's
  fixed :data:`ports.TICK_PORTS` (the one place a measured prediction
  prices ports)."""
  return dataclasses.replace(tick_costs, per_port_s=per_port_s,
                             tick_ports=_ports.TICK_PORTS)


def _measure(model: Any, costs: Any, unrolled: Any, plan: Any, mesh: Any,
             pipe_axis: str, tick_costs: _ticks.TickCosts) -> dict[str, Any]:
  """The record of ``plan``'s stand-in: its step, the serial part taken
  off, solved for the seconds per port (``ports.solve``)."""
  rendezvous = mesh.devices.flat[0].platform in _ticks.RENDEZVOUS_BACKENDS

  def idle(per_port: float) -> float:
    tick_model = _ticks.tick_model(plan, costs.link,
                                   priced(tick_costs, per_port),
                                   rendezvous=rendezvous)
    return model._replay(costs, unrolled, tick_model,  # pylint: disable=protected-access
                         idle=True).step_seconds

  # The record is kept for the machine: its fastest sample, the least
  # disturbed by whatever else runs at that moment (calibrate.time_step).
  standin_s = _processes.agree([model.time_program(
      _calibrate.standin_plan(plan), fastest=True)])[0]
  serial_s = sum(model.serial_seconds(costs, plan, plan.layout, mesh,
                                      pipe_axis))
  return {"per_port_s": _ports.solve(standin_s - serial_s, idle, 0.0, 1e-6),
          "standin_s": standin_s, "serial_s": serial_s,
          "statistic": "fastest sample",
          "plan": plan.loop_summary(),
          "ports": sum(_ticks.tick_ports(t) for t in plan.ticks),
          "idle_before_s": idle(0.0)}


class PortFigure(NamedTuple):
  """What :func:`port_seconds` found.

  Attributes:
    per_port_s: Seconds per port operation (0: not priced).
    final: The figure holds for the rest of the build (else a later plan
      may measure the machine).
    spent_s: Seconds spent timing (None: nothing was timed).
    measured: A record was measured here (not read from the cache).
  """

  per_port_s: float
  final: bool
  spent_s: float | None
  measured: bool


def port_seconds(model: Any, costs: Any, unrolled: Any, plan: Any,
                 mesh: Any, pipe_axis: str,
                 tick_costs: _ticks.TickCosts) -> PortFigure:
  """The seconds per port of ``model``'s machine (``CostModel.port_seconds``
  says when it is 0)."""
  can = (model.time_program is not None and _processes.single_process()
         and _ports.is_reference(plan))
  fields = _processes.mesh_fields(_processes.local_mesh(mesh, pipe_axis),
                                  pipe_axis)
  plan_key = _cache.make_key({"what": "portsplan",
                              "version": _ports.PORTS_VERSION, **fields,
                              "plan": _calibrate.plan_signature(plan)})
  measure = (lambda: _measure(model, costs, unrolled, plan, mesh, pipe_axis,
                              tick_costs)) if can else None
  t0 = time.perf_counter()
  try:
    rec, hit = _ports.cached_terms(model.cache, fields, measure, plan_key)
  except Exception as err:  # pylint: disable=broad-except
    # The prediction stays usable without it; say why, once.
    _LOG.warning("tessel_jax: the stand-in program of plan %s could not"
                 " be timed (%s: %s); the prediction prices no per-port"
                 " cost", plan.loop_summary(), type(err).__name__, err)
    return PortFigure(0.0, True, None, False)
  spent = time.perf_counter() - t0
  if rec is None:
    # Not measured here, or this plan is no per-port reference: priced 0
    # for this build; a later plan may measure the machine (unless tried).
    return PortFigure(0.0, can, spent if can else None, False)
  if not hit:
    _LOG.info("tessel_jax: lowered programs on this machine pay %.3g us"
              " per port operation (measured on the stand-in of plan %s,"
              " cached)", rec["per_port_s"] * 1e6, plan.loop_summary())
  return PortFigure(float(rec["per_port_s"]), True,
                    None if hit else spent, not hit)
