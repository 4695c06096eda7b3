"""Backward kernels priced with and without their fused gradient adds, on
the same measured steps (no flags here; see ``experiments.fused_grads_ab``).

``TESSEL_JAX_FUSED_GRADS`` (``cost.fused_grads``) changes only the kernel
profile, so the predictions of both pricings are compared against the
programs they choose, timed in the same shuffled rounds of one process. As
``experiments.model_zoo_spans`` builds with ``cost="measured"``: the
machine's per-port record measured first on the reference model, then
each model (2 fake single-threaded CPU devices, ``vshape(2)``,
``cut="auto"``) built twice, switch off then on, in one cache directory
(the per-port record shared; the kernels' keys differ). Per model one JSON
line: each pricing's predicted step, lowered plan, block ms, measured step
(median of the rounds) and measured / predicted, and whether both
lowered the same plan (then the two measured figures time one program).
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Callable, Iterator
from typing import Any

import jax
import numpy as np

import tessel_jax as tj
from experiments import model_zoo_spans_lib as spans
from experiments import realtime
from experiments.model_zoo_models import BUILDERS
from tessel_jax.cost import fused_grads

PRICINGS = {"old": "0", "fused": "1"}


@contextlib.contextmanager
def switch(value: str) -> Iterator[None]:
  """``TESSEL_JAX_FUSED_GRADS`` set to ``value`` for the block."""
  before = os.environ.get(fused_grads.ENV)
  os.environ[fused_grads.ENV] = value
  try:
    yield
  finally:
    if before is None:
      os.environ.pop(fused_grads.ENV, None)
    else:
      os.environ[fused_grads.ENV] = before


def build_chosen(model: Any, args: Any, mesh: Any, value: str
                 ) -> tuple[Callable[[], Any], dict[str, Any]]:
  """``model`` built as chosen with the switch at ``value``: its run and
  its prediction's row."""
  with switch(value):
    step = tj.schedule(model.fn, mesh=mesh,
                       placement=tj.placements.vshape(2),
                       num_microbatches=args.microbatches,
                       has_aux=model.has_aux, cut="auto", cost="measured",
                       seed=args.seed)
    built = step.build(model.params, model.batch)
  compiled = built.jitted.lower(model.params, model.batch).compile()
  rep = built.report
  return (lambda: compiled(model.params, model.batch)), {
      "predicted_ms": round(rep.predicted_step_ms, 3),
      "lowered_as": built.plan.loop_summary(),
      "makespan_steps": built.unrolled.makespan,
      "block_ms": {k: round(v, 3) for k, v in rep.block_ms.items()}}


def model_row(name: str, args: Any, mesh: Any) -> dict[str, Any]:
  """Both pricings of model ``name`` against their measured steps."""
  model = BUILDERS[name](args.rows * args.microbatches)
  runs, row = {}, {"model": name, "load": [round(os.getloadavg()[0], 2)]}
  for which, value in PRICINGS.items():
    runs[which], row[which] = build_chosen(model, args, mesh, value)
  for which, t in spans.time_rounds(runs, args.rounds, args.seed).items():
    row[which].update(t)
    row[which]["measured_over_predicted"] = round(
        t["measured_ms"] / row[which]["predicted_ms"], 3)
  row["same_plan"] = all(
      row["old"][k] == row["fused"][k] for k in ("lowered_as",
                                                 "makespan_steps"))
  row["load"].append(round(os.getloadavg()[0], 2))
  return row


def main(args: Any, log: Callable[[str], None] = print) -> int:
  """One JSON line per model (see the module doc)."""
  mesh = jax.sharding.Mesh(np.array(jax.devices()[:2]), ("pipe",))
  if args.realtime:
    realtime.realtime_threads()
  try:
    machine, _ = spans.calibrate_machine(args._replace(cost="measured"),
                                         mesh)
    log(json.dumps({"machine": machine}))
    for name in args.models:
      log(json.dumps(model_row(name, args, mesh)))
  finally:
    if args.realtime:
      realtime.normal_priority()
  return 0
