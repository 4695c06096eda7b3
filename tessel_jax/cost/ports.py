"""What a lowered program pays per port operation, measured once per machine.

The prediction from the kernels' profiles and the tick microbenchmark
(``ticks.measure_tick_costs``: a toy tick of one port of each kind) missed
much of what the lowered programs of the model zoo paid (JAX 0.10.2, 2 CPU
devices, ``vshape(2)``, N = 8: they ran 1.4-1.9x their prediction). Timing
each program with its kernels stood in for (``calibrate.standin_plan``: no
kernel work left) shows what the program pays around its kernels: 0.64-1.07
us per *port operation* of the step (``ticks.tick_ports`` summed over the
ticks: 521 for eqx_mlp, 2,161-4,748 for the transformers) above the tick
model on the five zoo models (load 6-9), 0.3-0.6 us on a batch-norm CNN
(1,098-1,166, load 12-13), where the gap per tick varied 10x (22-230 us)
and a toy tick of 1-32 ports gives 0.22 us per port operation. Each
port is several small XLA operations (the slot index from the device's
table, a dynamic slice or update, a select among candidates, the branch's
port), fused into a few thunks of XLA's CPU runtime each.

So a measured prediction prices ``per_port_s`` seconds per port operation
on every device at every tick (``TickCosts.per_port_s``), and every tick
as ``tick_ports`` more port operations (its fixed cost): the machine's
record (backend, device kind, mesh size, XLA flags, cores), cached on disk
(kind ``"ports"``) and used by every later plan and model on that machine.
It is fitted (``cost.port_fit``, :func:`fitted`) on the stand-in programs
of up to :data:`MAX_POINTS` plans built there: the first, and a later one
whose ports per tick lie :data:`POINT_SPREAD` outside the first's. Each is
compiled and timed by capped round medians (``calibrate.time_step``, as
``cost="calibrated"`` times them), less the part of the step serial with
the ticks (packing, unpacking, FSDP collectives, which every prediction
adds apart: ``cost.port_pricing``), against the replay of its ticks with
zero-time kernels. With one stand-in only ``per_port_s`` is fitted, every
tick worth :data:`TICK_PORTS`; with two of far different ports per tick,
both, where the fixed part the fit finds stays within a factor
``port_fit.MAX_BAND`` when either stand-in's timing moves by
``port_fit.REL_NOISE`` (else the prior: the zoo's two stand-ins, eqx_mlp
and the CNN at 17 and 50 ports per tick, gave 16-66 over quiet runs).
Until ``PORTS_VERSION`` 8 the record was the fastest sample of the first
plan's stand-in with a constant fixed part: five fresh records in six
minutes spread 5x (0.13-0.69 us, load 3.6-7.0), and eqx_mlp's 17 ports per
tick were priced at a third to a half of its own stand-in (helper zoo8).

Not every plan measures it: where the stand-in's time is not in its ports
the per-port figure is nonsense, 0 where the tick model's per-byte term already
over-prices the ticks (ports of tens of KiB: the README GPT) and 103 us
where the ticks move parameter-sized gradients (ResNet18, 11.7M
parameters: stand-in 306 ms against 45 ms predicted). So only a plan of small ports
measures the machine (:func:`is_reference`: at most
``MAX_REFERENCE_BYTES_PER_PORT`` of tick traffic per port operation; the zoo
and the CNN move 1.2-9.9 KB per port op, the README GPT 77 KB, ResNet18
455 KB), and a result outside ``(0, MAX_PER_PORT_S]`` is not stored as the
machine's figure either: that plan is remembered (kind ``"portsplan"``) so
that it is not timed again, and the next plan built on the machine tries.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from tessel_jax.cost import port_fit, ticks

#: Bump when the port count or what the terms cover changes (5: solved
#: over ticks priced in one device's core-seconds; an interp tick priced
#: per device, with its own kernels' ports and its segment's rounds; 6:
#: every tick also pays :data:`TICK_PORTS`; 7: the stand-in's serial part,
#: packing, unpacking and FSDP collectives, taken off before the solve:
#: every prediction adds it itself, ``cost.port_pricing``; 8: the record
#: is a fit of the fixed per-tick part and the per-port part together over
#: up to :data:`MAX_POINTS` stand-ins timed by capped round medians; 9: a
#: gradient port priced as ``ticks.GRAD_PORTS`` port operations, and a
#: two-point fit far off :data:`TICK_PORTS` not kept; 10: nor one whose
#: fixed part a stand-in's timing noise moves more than
#: ``port_fit.MAX_BAND``; 11: ``ticks.GRAD_PORTS`` 1 -> 10).
PORTS_VERSION = 11
#: Port operations' worth of fixed cost every tick pays on every device
#: beyond its own ports (the tick loop's step, its table lookups, the
#: kernels' 0/1-trip loop conditions) while the record holds one stand-in
#: only, or points that do not pin the fixed part down (``port_fit.fit``;
#: with two far apart in ports per tick both parts are fitted). Fitted (``port_fit.fit``) on the stand-ins of the five zoo
#: models and the batch-norm CNN by capped round medians, at real-time
#: priority as ``model_zoo_spans`` builds (2 devices, ``vshape(2)``, N = 8,
#: 25 ticks, load 3.6-8.6, ``experiments.port_record_probe``): 42 ports
#: per tick plus 0.86 us per port put four of the six within 5% of their
#: stand-in (eqx_transformer 0.78x, penzai_llama 1.20x), where 20 (fitted
#: at normal priority, load 14.5, session 30) priced eqx_mlp's at 0.80x.
TICK_PORTS = 40.0
#: Most stand-ins (points) one machine's record is fitted on: each later
#: reference plan whose ports per tick lie outside the record's range by
#: :data:`POINT_SPREAD` adds its stand-in, until the record holds this many.
MAX_POINTS = 2
#: Rounds of samples a point's stand-in is timed in (the smallest round
#: median is kept, ``calibrate.time_step``; ``cost="calibrated"`` takes 3):
#: kept for the machine, it is worth a few more chances of a round free of
#: a busy neighbour (a millisecond program: about 0.1 s more).
RECORD_ROUNDS = 8
#: Ratio of ports per tick beyond the record's smallest or largest that
#: makes a plan's stand-in a new point of the fit.
POINT_SPREAD = 1.5
#: Largest seconds per port operation taken as a machine's figure: twice
#: the largest measured on the model zoo (1.07 us, load 6-9).
MAX_PER_PORT_S = 2e-6
#: Largest tick traffic per port operation (``ticks.tick_traffic`` over
#: ``ticks.tick_ports``, summed over the ticks) of a reference plan.
MAX_REFERENCE_BYTES_PER_PORT = 32 * 1024


def is_reference(plan: Any) -> bool:
  """Whether ``plan``'s stand-in may measure the machine's per-port cost:
  its ticks' time is in their port operations, not their bytes."""
  n = sum(ticks.tick_ports(t) for t in plan.ticks)
  traffic = sum(ticks.tick_traffic(t) for t in plan.ticks)
  return n > 0 and traffic <= MAX_REFERENCE_BYTES_PER_PORT * n


def port_key(fields: Mapping[str, Any]) -> str:
  """Cache key of the per-machine record (``fields``: the mesh and
  backend facts, ``CostModel._mesh_fields``)."""
  from tessel_jax.cost.cache import make_key  # pylint: disable=import-outside-toplevel
  return make_key({"what": "ports", "version": PORTS_VERSION, **fields})


def fitted(points: list[dict[str, Any]]) -> dict[str, Any]:
  """The machine's record of ``points`` (``cost.port_fit``): its
  ``per_port_s`` and ``tick_ports`` fitted together where the points'
  ports per tick span :data:`POINT_SPREAD` and pin the fixed part down,
  else with :data:`TICK_PORTS`."""
  per_port, tick_ports = port_fit.fit(points, TICK_PORTS, POINT_SPREAD)
  return {"per_port_s": per_port, "tick_ports": tick_ports,
          "points": list(points), "standin_s": points[0]["standin_s"],
          "statistic": "capped round medians"}


def cached_terms(cache: Any, fields: Mapping[str, Any],
                 measure: Callable[[], dict[str, Any]] | None,
                 plan_key: str | None = None,
                 ports_per_tick: Callable[[], float] | None = None
                 ) -> tuple[dict[str, Any] | None, bool]:
  """``(record, from the cache?)`` of the machine (:func:`fitted`).

  ``measure()`` times a plan's stand-in: one point of the fit
  (``cost.port_fit``). It is called where nothing is cached, or where the
  cached record holds fewer than :data:`MAX_POINTS` points and the plan's
  ``ports_per_tick()`` lies outside their range by :data:`POINT_SPREAD`;
  the refitted record then replaces the cached one. A point whose excess
  over the tick model is not positive, or whose own ``per_port_s`` (alone,
  with :data:`TICK_PORTS`) or refitted record's falls outside
  ``(0, MAX_PER_PORT_S]``, is not kept: its plan is
  remembered under ``plan_key`` (kind ``"portsplan"``) so that it is not
  timed again, and the record stays as it was (None where there was
  none). Not from the cache (False) whenever ``measure`` ran.
  """
  key = port_key(fields)
  rec = cache.get("ports", key)
  if rec is not None and (measure is None or ports_per_tick is None or
                          not port_fit.wants(rec["points"], ports_per_tick(),
                                             MAX_POINTS, POINT_SPREAD)):
    return rec, True
  if measure is None or (plan_key is not None and
                         cache.get("portsplan", plan_key) is not None):
    return rec, rec is not None
  point = measure()
  own = fitted([point])["per_port_s"]
  new = fitted((rec["points"] if rec is not None else []) + [point])
  if (float(point["excess_s"]) > 0 and 0.0 < own <= MAX_PER_PORT_S and
      0.0 < new["per_port_s"] <= MAX_PER_PORT_S):
    cache.put("ports", key, new)
    return new, False
  if plan_key is not None:
    cache.put("portsplan", plan_key, {**point, "per_port_s": max(0.0, own)})
  return rec, False
