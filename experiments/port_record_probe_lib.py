"""What ``python -m experiments.port_record_probe`` does (helper zoo8,
session 32): why ``cost="measured"`` prices eqx_mlp's ticks below its own
stand-in program.

One line of JSON per model on stdout. For each model, in order, on 2 fake
single-threaded CPU devices as ``experiments.model_zoo_spans`` (vshape(2),
N and rows from the flags (8 and 4), ``cut="auto"``, cost="measured", normal priority unless
``--realtime``), builds the model, then on the lowered plan:

* ``per_port_ref_us`` and ``tick_ports_ref``: the machine's per-port
  record in use (fitted on the stand-ins of the first reference plans built
  in this cache, ``cost.port_fit``; ``cost.port_pricing``);
* the plan's own stand-in program re-timed ``--reps`` times each way,
  interleaved: ``calibrate.time_step`` fastest sample and capped round
  medians (what ``cost="calibrated"`` uses);
* the per-port figure each implies (``port_solve.solve`` with
  ``ports.TICK_PORTS``,
  serial part off) and the full prediction (kernels + ticks +
  serial) with the record, with the own figure, and with the
  ``cost="calibrated"`` pricing (``TickModel.plus_calls``);
* the lowered step's median wall of 15 calls;
* ``point``: the plan's point of the machine's record (``cost.port_fit``)
  by the capped round medians.

A last line ``fits``: every model's stand-in against the record fitted on
all the models, on the first alone, on the first two and on the first
three, and every model's step against its prediction repriced with each
of those records (:func:`fits`).

It reads the cost model's arguments by wrapping ``CostModel.predict`` for
the duration of :func:`main` (a diagnostic: no public hook gives them).
The process must have its 2 devices before jax starts
(``model_zoo_flags.two_devices``, which the binary calls).
"""

from __future__ import annotations

import json
import random
import statistics
import time
from typing import Any

# pylint: disable=protected-access
import jax
import numpy as np

import tessel_jax as tj
from experiments import port_solve, realtime
from experiments.model_zoo_models import BUILDERS
from tessel_jax.cost import calibrate as C
from tessel_jax.cost import model as M
from tessel_jax.cost import port_pricing as PP
from tessel_jax.cost import ports as P
from tessel_jax.cost import ticks as T

_LAST: dict[str, Any] = {}
_ORIG = M.CostModel.predict


def _predict(self, *a):
  """``CostModel.predict``, remembering its last call during a build (the
  timers are only set then)."""
  if self.time_program is not None:
    costs, _, plan, mesh, axis = a
    _LAST["args"] = (self, a, self.time_program, sum(
        self.serial_seconds(costs, plan, plan.layout, mesh, axis)))
  return _ORIG(self, *a)


def probe(name: str, mesh: Any, args: Any) -> dict[str, Any]:
  """The figures of the module doc for model ``name`` (``args``: a
  ``port_record_probe_args.ProbeArgs``)."""
  model = BUILDERS[name](args.microbatches * args.rows)
  if args.realtime:
    realtime.realtime_threads()
  step = tj.schedule(model.fn, mesh=mesh, placement=tj.placements.vshape(2),
                     num_microbatches=args.microbatches, has_aux=model.has_aux, cut="auto",
                     cost="measured", seed=0)
  built = step.build(model.params, model.batch)
  cm, (costs, unrolled, plan, mesh_, axis), timer, serial = _LAST["args"]
  if plan.loop_summary() != built.plan.loop_summary():
    raise RuntimeError(f"{name}: the last predict() was not the build's plan")
  rec = {"plan": plan.loop_summary(), "ticks": len(plan.ticks),
         "ports": sum(T.tick_ports(t) for t in plan.ticks),
         "pred_ms_report": built.report.predicted_step_ms,
         "per_port_ref_us": cm._per_port[0] * 1e6,
         "tick_ports_ref": cm._per_port[1], "serial_ms": serial * 1e3}
  tc0 = cm.tick_costs(mesh_, axis)

  def tmodel(pp, k=P.TICK_PORTS):
    return T.tick_model(plan, costs.link, PP.priced(tc0, pp, k),
                        rendezvous=True)

  def idle(pp):
    return cm._replay(costs, unrolled, tmodel(pp), idle=True).step_seconds

  def full(tm):
    return (cm._replay(costs, unrolled, tm).step_seconds + serial) * 1e3

  rec["full_ms_ref_per_port"] = full(tmodel(*cm._per_port))
  rec["tick_ms_ref_per_port"] = tmodel(*cm._per_port).mean_tick_seconds * 1e3
  sp = C.standin_plan(plan)
  fast, med = [], []
  for _ in range(args.reps):
    for f in random.sample([True, False], 2):
      (fast if f else med).append(timer(sp, fastest=f))
  rec["standin_fastest_ms"] = [round(x * 1e3, 3) for x in fast]
  rec["standin_median_ms"] = [round(x * 1e3, 3) for x in med]
  bare = T.tick_model(plan, costs.link, tc0, rendezvous=True)
  calls = T.kernel_calls(plan)
  for lab, xs in (("fastest", fast), ("median", med)):
    s = statistics.median(xs)
    pp = port_solve.solve(s - serial, idle, 0.0, 1e-6)
    rec[f"per_port_us_own_{lab}"] = pp * 1e6
    rec[f"full_ms_own_per_port_{lab}"] = full(tmodel(pp))
    rec[f"tick_ms_own_per_port_{lab}"] = tmodel(pp).mean_tick_seconds * 1e3
    extra = C.extra_tick_seconds(s - serial, lambda x: cm._replay(
        costs, unrolled, bare.plus_calls(x, calls), idle=True).step_seconds)
    rec[f"full_ms_calibrated_{lab}"] = full(bare.plus_calls(extra, calls))
  compiled = built.jitted.lower(model.params, model.batch).compile()
  jax.block_until_ready(compiled(model.params, model.batch))
  walls = []
  for _ in range(15):
    t0 = time.perf_counter()
    jax.block_until_ready(compiled(model.params, model.batch))
    walls.append(time.perf_counter() - t0)
  rec["step_ms_median15"] = statistics.median(walls) * 1e3
  idle_s, port_s, tick_s = PP._Shape(cm, costs, unrolled, plan, mesh_,
                                     tc0).slopes()
  s = statistics.median(med)
  rec["point"] = {"excess_s": s - serial - idle_s, "port_s": port_s,
                  "tick_s": tick_s, "standin_s": s, "serial_s": serial,
                  "idle_s": idle_s}
  return {k: round(v, 4) if isinstance(v, float) else v
          for k, v in rec.items()}


def fits(points: dict[str, dict[str, Any]],
         rows: dict[str, dict[str, Any]] | None = None) -> dict[str, Any]:
  """Each model's stand-in (capped round medians, serial part off) against
  the record fitted (``ports.fitted``) on all models, on the first one
  (``ports.TICK_PORTS``), on the first two (the record ``model_zoo_spans``
  builds: the reference and eqx_mlp) and on the first three (what a third
  point would give): predicted over measured, by model; with ``rows`` (a
  model's :func:`probe` record), also each model's lowered step over its
  prediction repriced with that record (:func:`repriced_ms`), all variants
  against the same timed step."""
  names = list(points)
  out = {}
  for label, use in (("all", names), ("first", names[:1]),
                     ("first2", names[:2]), ("first3", names[:3])):
    rec = P.fitted([points[n] for n in use])
    ratios = {}
    for n, p in points.items():
      pred = (p["idle_s"] + rec["per_port_s"] * (
          p["port_s"] + rec["tick_ports"] * p["tick_s"]))
      ratios[n] = round(pred / (p["standin_s"] - p["serial_s"]), 3)
    out[label] = {"per_port_us": round(rec["per_port_s"] * 1e6, 4),
                  "tick_ports": round(rec["tick_ports"], 2),
                  "predicted_over_standin": ratios}
    if rows:
      out[label]["step_over_predicted"] = {
          n: round(r["step_ms_median15"] / repriced_ms(
              r, points[n], rec["per_port_s"], rec["tick_ports"]), 3)
          for n, r in rows.items()}
  return out


def repriced_ms(row: dict[str, Any], point: dict[str, Any],
                per_port_s: float, tick_ports: float) -> float:
  """``row``'s predicted step (ms) with the record's per-port part
  replaced by ``per_port_s`` and ``tick_ports``, along the replay's
  slopes of its ``point`` (the critical path held: a first-order change)."""
  def priced(pp: float, k: float) -> float:
    return pp * (point["port_s"] + k * point["tick_s"])
  old = priced(row["per_port_ref_us"] * 1e-6, row["tick_ports_ref"])
  return row["pred_ms_report"] + (priced(per_port_s, tick_ports) - old) * 1e3


def main(args: Any) -> None:
  """Prints one JSON line of :func:`probe` per model of ``args.models``
  (``args``: a ``port_record_probe_args.ProbeArgs``)."""
  M.CostModel.predict = _predict
  try:
    mesh = jax.sharding.Mesh(np.array(jax.devices()[:2]), ("pipe",))
    points, rows = {}, {}
    for name in args.models:
      rec = probe(name, mesh, args)
      points[name], rows[name] = rec["point"], rec
      print(json.dumps({name: rec}), flush=True)
    print(json.dumps({"fits": fits(points, rows)}), flush=True)
  finally:
    M.CostModel.predict = _ORIG
    if args.realtime:
      realtime.normal_priority()
