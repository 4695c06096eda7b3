"""Diagnostic probe (helper zoo8, session 32): why ``cost="measured"``
prices eqx_mlp's ticks below its own stand-in program.

Not an absl runner (no flags, no JSON; one line of JSON per model on
stdout). For each model named on the command line, in order, on 2 fake
single-threaded CPU devices as ``experiments.model_zoo_spans`` (vshape(2),
N = 8, 4 rows, ``cut="auto"``, cost="measured", normal priority), builds the
model, then on the lowered plan:

* ``per_port_ref_us``: the machine's per-port record in use (the stand-in
  of the first reference plan built in this cache, its fastest sample,
  ``cost.port_pricing``);
* the plan's own stand-in program re-timed ``REPS`` times (env, default 6)
  each way, interleaved: ``calibrate.time_step`` fastest sample and capped
  round medians (what ``cost="calibrated"`` uses);
* the per-port figure each implies (``ports.solve`` as ``port_pricing``
  does, serial part off) and the full prediction (kernels + ticks +
  serial) with the record, with the own figure, and with the
  ``cost="calibrated"`` pricing (``TickModel.plus_calls``);
* the lowered step's median wall of 15 calls.

``REALTIME=1`` runs it all at real-time priority where allowed.

Usage (fresh cache: the first model built measures the machine):
  TESSEL_JAX_CACHE=$(mktemp -d) python -m experiments.port_record_probe \
      nnx_bn_cnn eqx_mlp
"""

from __future__ import annotations

import json
import os
import random
import statistics
import sys
import time
from typing import Any

from experiments import model_zoo_flags

model_zoo_flags.two_devices()

# pylint: disable=wrong-import-position,protected-access
import jax  # noqa: E402
import numpy as np  # noqa: E402

import tessel_jax as tj  # noqa: E402
from experiments import realtime  # noqa: E402
from experiments.model_zoo_models import BUILDERS  # noqa: E402
from tessel_jax.cost import calibrate as C  # noqa: E402
from tessel_jax.cost import model as M  # noqa: E402
from tessel_jax.cost import port_pricing as PP  # noqa: E402
from tessel_jax.cost import ports as P  # noqa: E402
from tessel_jax.cost import ticks as T  # noqa: E402

REPS = int(os.environ.get("REPS", "6"))
#: ``REALTIME=1``: every thread at real-time priority from the first build
#: on, as ``model_zoo_spans`` times (``experiments.realtime``).
REALTIME = os.environ.get("REALTIME") == "1"
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


def probe(name: str, mesh: Any) -> dict[str, Any]:
  """The figures of the module doc for model ``name``."""
  model = BUILDERS[name](32)
  if REALTIME:
    realtime.realtime_threads()
  step = tj.schedule(model.fn, mesh=mesh, placement=tj.placements.vshape(2),
                     num_microbatches=8, has_aux=model.has_aux, cut="auto",
                     cost="measured", seed=0)
  built = step.build(model.params, model.batch)
  cm, (costs, unrolled, plan, mesh_, axis), timer, serial = _LAST["args"]
  assert plan.loop_summary() == built.plan.loop_summary()
  rec = {"plan": plan.loop_summary(), "ticks": len(plan.ticks),
         "ports": sum(T.tick_ports(t) for t in plan.ticks),
         "pred_ms_report": built.report.predicted_step_ms,
         "per_port_ref_us": cm._per_port * 1e6, "serial_ms": serial * 1e3}
  tc0 = cm.tick_costs(mesh_, axis)

  def tmodel(pp):
    return T.tick_model(plan, costs.link, PP.priced(tc0, pp), rendezvous=True)

  def idle(pp):
    return cm._replay(costs, unrolled, tmodel(pp), idle=True).step_seconds

  def full(tm):
    return (cm._replay(costs, unrolled, tm).step_seconds + serial) * 1e3

  rec["full_ms_ref_per_port"] = full(tmodel(cm._per_port))
  rec["tick_ms_ref_per_port"] = tmodel(cm._per_port).mean_tick_seconds * 1e3
  sp = C.standin_plan(plan)
  fast, med = [], []
  for _ in range(REPS):
    for f in random.sample([True, False], 2):
      (fast if f else med).append(timer(sp, fastest=f))
  rec["standin_fastest_ms"] = [round(x * 1e3, 3) for x in fast]
  rec["standin_median_ms"] = [round(x * 1e3, 3) for x in med]
  bare = T.tick_model(plan, costs.link, tc0, rendezvous=True)
  calls = T.kernel_calls(plan)
  for lab, xs in (("fastest", fast), ("median", med)):
    s = statistics.median(xs)
    pp = P.solve(s - serial, idle, 0.0, 1e-6)
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
  return {k: round(v, 4) if isinstance(v, float) else v
          for k, v in rec.items()}


def main(names: list[str]) -> None:
  M.CostModel.predict = _predict
  try:
    mesh = jax.sharding.Mesh(np.array(jax.devices()[:2]), ("pipe",))
    for name in names:
      print(json.dumps({name: probe(name, mesh)}), flush=True)
  finally:
    M.CostModel.predict = _ORIG
    if REALTIME:
      realtime.normal_priority()


if __name__ == "__main__":
  main(sys.argv[1:] or ["nnx_bn_cnn", "eqx_mlp"])
