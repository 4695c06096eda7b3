"""The machine's per-port record, for one :class:`CostModel`.

``cost.ports`` says what the record is and ``cost.port_fit`` how it is
fitted; this module wires it to a cost model: read from the disk cache,
else (or where the record wants another point) measured on the stand-in
program of the first reference plan a build prices
(``CostModel.time_program``) against the replay's slopes (:class:`_Shape`),
and priced into the tick costs in one place (:func:`priced`).

What the stand-in program's step holds beyond its ticks: the packing and
unpacking around them and any FSDP collectives (``CostModel.serial_seconds``),
which every prediction adds to the replay of the ticks itself. Until
``ports.PORTS_VERSION`` 7 the solve gave the ticks the stand-in's whole
step, so the outside was paid twice in every measured prediction: on the
reference batch-norm CNN (2 CPU devices, ``vshape(2)``, N = 8, three runs
at load 10-21) 0.68-0.71 ms of a 2.5-4.2 ms stand-in whose ticks price
0.6-1.6 ms at zero per port, so the per-port figure came out 1.4-1.9x.
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


def priced(tick_costs: _ticks.TickCosts, per_port_s: float,
           tick_ports: float = _ports.TICK_PORTS) -> _ticks.TickCosts:
  """``tick_costs`` with ``per_port_s`` per port operation and every tick's
  fixed ``tick_ports`` (the machine's record, :class:`PortFigure`; the one
  place a measured prediction prices ports)."""
  return dataclasses.replace(tick_costs, per_port_s=per_port_s,
                             tick_ports=tick_ports)


#: Seconds per port and fixed port operations per tick at which the
#: replay's slopes are taken (about the figures measured on 2 CPU devices).
_PROBE_S, _PROBE_PORTS = 1e-6, 20.0


class _Shape:
  """``plan``'s replay with zero-time kernels, by per-port seconds and
  fixed ports per tick, and its slopes (computed once)."""

  def __init__(self, model: Any, costs: Any, unrolled: Any, plan: Any,
               mesh: Any, tick_costs: _ticks.TickCosts) -> None:
    rendezvous = mesh.devices.flat[0].platform in _ticks.RENDEZVOUS_BACKENDS

    def idle(per_port: float, tick_ports: float) -> float:
      tick_model = _ticks.tick_model(
          plan, costs.link, priced(tick_costs, per_port, tick_ports),
          rendezvous=rendezvous)
      return model._replay(costs, unrolled, tick_model,  # pylint: disable=protected-access
                           idle=True).step_seconds

    self.idle = idle
    self._slopes: tuple[float, float, float] | None = None

  def slopes(self) -> tuple[float, float, float]:
    """``(idle_s, port_s, tick_s)``: the replay at zero per port, and its
    slopes in the seconds per port (port operations on its critical path)
    and in the seconds every tick pays (ticks on it)."""
    if self._slopes is None:
      base = self.idle(0.0, _ports.TICK_PORTS)   # 0 s per port: any
      ports = self.idle(_PROBE_S, 0.0)
      both = self.idle(_PROBE_S, _PROBE_PORTS)
      self._slopes = (base, (ports - base) / _PROBE_S,
                      (both - ports) / (_PROBE_S * _PROBE_PORTS))
    return self._slopes

  def ports_per_tick(self) -> float:
    _, port_s, tick_s = self.slopes()
    return port_s / max(tick_s, 1e-12)


def _measure(model: Any, plan: Any, mesh: Any, pipe_axis: str, costs: Any,
             shape: _Shape) -> dict[str, Any]:
  """One point of the record (``cost.port_fit``): ``plan``'s stand-in
  timed by capped round medians (as ``cost="calibrated"`` times it, over
  ``ports.RECORD_ROUNDS`` rounds), its serial part taken off, against the
  replay's slopes."""
  standin_s = _processes.agree([model.time_program(
      _calibrate.standin_plan(plan), rounds=_ports.RECORD_ROUNDS)])[0]
  serial_s = sum(model.serial_seconds(costs, plan, plan.layout, mesh,
                                      pipe_axis))
  idle_s, port_s, tick_s = shape.slopes()
  return {"excess_s": standin_s - serial_s - idle_s, "port_s": port_s,
          "tick_s": tick_s, "standin_s": standin_s, "serial_s": serial_s,
          "idle_s": idle_s, "plan": plan.loop_summary(),
          "ports": sum(_ticks.tick_ports(t) for t in plan.ticks)}


class PortFigure(NamedTuple):
  """What :func:`port_seconds` found.

  Attributes:
    per_port_s: Seconds per port operation (0: not priced).
    tick_ports: Port operations' worth of fixed cost every tick pays.
    final: The figure holds for the rest of the build (else a later plan
      may measure the machine).
    spent_s: Seconds spent timing (None: nothing was timed).
    measured: A record was measured here (not read from the cache).
  """

  per_port_s: float
  tick_ports: float
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
  shape = _Shape(model, costs, unrolled, plan, mesh, tick_costs)
  measure = (lambda: _measure(model, plan, mesh, pipe_axis, costs, shape)
             ) if can else None
  t0 = time.perf_counter()
  try:
    rec, hit = _ports.cached_terms(model.cache, fields, measure, plan_key,
                                   shape.ports_per_tick)
  except Exception as err:  # pylint: disable=broad-except
    # The prediction stays usable without it; say why, once.
    _LOG.warning("tessel_jax: the stand-in program of plan %s could not"
                 " be timed (%s: %s); the prediction prices no per-port"
                 " cost", plan.loop_summary(), type(err).__name__, err)
    return PortFigure(0.0, _ports.TICK_PORTS, True, None, False)
  spent = time.perf_counter() - t0
  if rec is None:
    # Not measured here, or this plan is no per-port reference: priced 0
    # for this build; a later plan may measure the machine (unless tried).
    return PortFigure(0.0, _ports.TICK_PORTS, can, spent if can else None,
                      False)
  if not hit:
    _LOG.info("tessel_jax: lowered programs on this machine pay %.3g us"
              " per port operation and %.3g port operations per tick"
              " (fitted on %d stand-ins, the last of plan %s; cached)",
              rec["per_port_s"] * 1e6, rec["tick_ports"], len(rec["points"]),
              plan.loop_summary())
  return PortFigure(float(rec["per_port_s"]), float(rec["tick_ports"]), True,
                    None if hit else spent, not hit)
