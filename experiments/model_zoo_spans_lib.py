"""Measured against uniform spans on the model zoo (no flags here).

See ``experiments.model_zoo_spans``. With ``cost="calibrated"``,
``tj.schedule`` searches two schedules, one on the measured spans and one on
uniform spans (F=1, B=2, W=1), predicts both with the cost model and lowers
the one predicted faster. This runner checks that choice on the zoo's real
models: in one worker process of 2 fake single-threaded CPU devices pinned
to 2 cores, each model (training, ``vshape(2)``, ``cut="auto"``) is built
three times from one profile: as chosen, and forced to each candidate (the
choice wrapped, see :func:`forced`); both candidates are built (kernels
and stand-in programs profiled) and timed in shuffled rounds at real-time
priority where allowed (``experiments.realtime``). Per model: the automatic
choice, each candidate's predicted and measured step (median of the
rounds), which one measured faster, and whether the choice took it.
After a model's rounds both candidates are profiled and priced again on an
empty cache (:func:`priced_again`): the predictions before and after the
rounds bracket them: how far a new profile moves the price (the machine
between profile and timing, or the profile's own noise) beside how far
the measured step is from either.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import random
import resource
import statistics
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any, NamedTuple

import jax
import numpy as np

import tessel_jax as tj
from experiments import model_zoo_rows, realtime
from experiments.model_zoo_rows import ZOO_MODELS
from experiments.model_zoo_models import BUILDERS  # noqa: F401 (args)
from tessel_jax import schedule_choice as _schedule_choice
from tessel_jax.cost import ports as _ports

CANDIDATES = ("measured", "uniform")
DEFAULT_MODELS = ZOO_MODELS


class SpansArgs(NamedTuple):
  """Everything the runner needs; see the flags."""

  models: tuple[str, ...] = DEFAULT_MODELS
  microbatches: int = 8
  rows: int = 4
  rounds: int = 7
  realtime: bool = True
  seed: int = 0
  output: str | None = "results/model_zoo/spans.json"
  cost: str = "calibrated"
  reference: str | None = "nnx_bn_cnn"
  price_after: bool = True


@contextlib.contextmanager
def forced(which: str | None, choices: list[str]) -> Iterator[None]:
  """Lowers the candidate ``which`` ("measured": searched on the measured
  spans, on the automatic or the coarser grid, the cheaper / "uniform";
  None: as chosen) whatever the prediction says; appends the automatic
  choice to ``choices``. Wraps ``schedule_choice.choose`` for the block."""
  orig = _schedule_choice.choose

  def choose(*args, **kwargs):
    res = orig(*args, **kwargs)
    if res is None or len(res.priced) < 2:
      return res
    # ("measured": either grid of the measured spans, as CANDIDATES say)
    choices.append("uniform" if res.taken == "uniform" else "measured")
    if which == "measured" and res.taken == "uniform":
      return res.take(min((p for p in res.priced if p.name != "uniform"),
                          key=lambda p: p.seconds).name)
    if which == "uniform":
      return res.take("uniform")
    return res

  _schedule_choice.choose = choose
  try:
    yield
  finally:
    _schedule_choice.choose = orig


def _cpu_s() -> float:
  r = resource.getrusage(resource.RUSAGE_SELF)
  return r.ru_utime + r.ru_stime


def _build_candidate(model: Any, which: str | None, args: SpansArgs,
                     mesh: Any, choices: list[str],
                     cache_dir: str | None = None) -> Any:
  """``model`` built with the candidate ``which`` forced (None: as
  chosen; :func:`forced`); ``cache_dir``: a cost and schedule cache of its
  own (None: the process's)."""
  with forced(which, choices):
    step = tj.schedule(model.fn, mesh=mesh,
                       placement=tj.placements.vshape(2),
                       num_microbatches=args.microbatches,
                       has_aux=model.has_aux, cut="auto", cost=args.cost,
                       seed=args.seed, cache_dir=cache_dir)
    return step.build(model.params, model.batch)


def build_model(name: str, args: SpansArgs, mesh: Any
                ) -> tuple[dict[str, Callable[[], Any]], dict[str, Any], Any]:
  """Both candidates of one model: ``({candidate: run}, row, model)``."""
  model = BUILDERS[name](args.rows * args.microbatches)
  row: dict[str, Any] = {"model": name}
  runs = {}
  for which in (None,) + CANDIDATES:
    choices: list[str] = []
    built = _build_candidate(model, which, args, mesh, choices)
    rep = built.report
    if which is None:
      row["choice"] = choices[0] if choices else "measured (no alternative)"
      continue
    compiled = built.jitted.lower(model.params, model.batch).compile()
    runs[which] = (lambda c: lambda: c(model.params, model.batch))(compiled)
    row[which] = {"predicted_ms": round(rep.predicted_step_ms, 3),
                  "lowered_as": built.plan.loop_summary(),
                  "makespan_steps": built.unrolled.makespan,
                  **price_parts(rep)}
  return runs, row, model


def price_parts(rep: Any, suffix: str = "") -> dict[str, Any]:
  """The measured figures a prediction is made of (``CostReport``): each
  block's kernel ms and the per-tick, barrier and outside ms."""
  return {"block_ms" + suffix: {k: round(v, 3)
                                for k, v in rep.block_ms.items()},
          **{name + suffix: round(getattr(rep, name), 3)
             for name in ("tick_overhead_ms", "barrier_ms", "outside_ms")}}


def priced_again(model: Any, args: SpansArgs, mesh: Any,
                 row: dict[str, Any]) -> None:
  """Each candidate of ``row`` profiled and priced again after its timing
  rounds (an empty cache: kernels, stand-ins and the machine's per-port
  cost measured anew), as ``predicted_after_ms`` with its parts, and
  whether the build lowered the same schedule (``same_plan_after``: loop
  summary and makespan; the automatic cut may still differ). The
  prediction made before the rounds and this one bracket them: where the
  two differ, the profile moved (the machine, or the profile's noise), and
  measured over their geometric mean (``measured_over_bracket``) shares
  that out."""
  for c in CANDIDATES:
    if c not in row:
      continue
    with tempfile.TemporaryDirectory(prefix="tj_zoo_after_") as cache:
      built = _build_candidate(model, c, args, mesh, [], cache_dir=cache)
    got = row[c]
    got["predicted_after_ms"] = round(built.report.predicted_step_ms, 3)
    got.update(price_parts(built.report, "_after"))
    got["same_plan_after"] = (
        built.plan.loop_summary() == got["lowered_as"]
        and built.unrolled.makespan == got["makespan_steps"])


def time_rounds(runs: dict[str, Callable[[], Any]], rounds: int, seed: int
                ) -> dict[str, dict[str, float]]:
  """Median wall and CPU ms of each run over shuffled rounds."""
  rng = random.Random(seed)
  for run in runs.values():
    jax.block_until_ready(run())
  walls: dict[str, list[float]] = {k: [] for k in runs}
  cpus: dict[str, list[float]] = {k: [] for k in runs}
  for _ in range(rounds):
    order = list(runs)
    rng.shuffle(order)
    for k in order:
      c0, t0 = _cpu_s(), time.perf_counter()
      jax.block_until_ready(runs[k]())
      walls[k].append(time.perf_counter() - t0)
      cpus[k].append(_cpu_s() - c0)
  return {k: {"measured_ms": round(1e3 * statistics.median(walls[k]), 3),
              "cpu_ms": round(1e3 * statistics.median(cpus[k]), 3)}
          for k in runs}


def judge(row: dict[str, Any]) -> dict[str, Any]:
  """Adds the faster candidate, whether the choice took it, and each
  candidate's measured / predicted."""
  if not all(c in row and "measured_ms" in row[c] for c in CANDIDATES):
    return row
  fast = min(CANDIDATES, key=lambda c: row[c]["measured_ms"])
  row["faster_measured"] = fast
  row["choice_right"] = row["choice"].split()[0] == fast or (
      abs(row["measured"]["measured_ms"] - row["uniform"]["measured_ms"])
      <= 0.05 * row[fast]["measured_ms"])
  for c in CANDIDATES:
    got = row[c]
    got["measured_over_predicted"] = round(
        got["measured_ms"] / got["predicted_ms"], 3)
    if got.get("predicted_after_ms"):
      got["drift"] = round(got["predicted_after_ms"] / got["predicted_ms"], 3)
      got["measured_over_bracket"] = round(got["measured_ms"] / math.sqrt(
          got["predicted_ms"] * got["predicted_after_ms"]), 3)
  return row


def markdown(rows: Sequence[dict[str, Any]]) -> str:
  lines = ["| model | chosen | measured spans: predicted / measured ms |"
           " uniform spans: predicted / measured ms | faster measured |"
           " choice right (within 5%) | measured / predicted (chosen) |"
           " priced after / before (chosen) | measured / bracket (chosen) |",
           "|---|---|---|---|---|---|---|---|---|"]
  for r in rows:
    if "error" in r:
      lines.append(f"| {r['model']} | error: {r['error'][:100]} ||||||")
      continue
    cells = []
    for c in CANDIDATES:
      d = r.get(c, {})
      cells.append(f"{d.get('predicted_ms', '-')} / {d.get('measured_ms', '-')}"
                   f" (`{d.get('lowered_as', '')}`)")
    chosen = r["choice"].split()[0]
    took = r.get(chosen, {})
    drift = took.get("drift", "-")
    if took.get("same_plan_after") is False:
      drift = f"{drift} (another plan)"
    lines.append(f"| {r['model']} | {r['choice']} | {cells[0]} | {cells[1]} |"
                 f" {r.get('faster_measured', '-')} |"
                 f" {r.get('choice_right', '-')} |"
                 f" {took.get('measured_over_predicted', '-')} | {drift} |"
                 f" {took.get('measured_over_bracket', '-')} |")
  return "\n".join(lines)


def calibrate_machine(args: SpansArgs, mesh: Any
                      ) -> tuple[dict[str, Any] | None, Any]:
  """With ``cost="measured"``: builds ``args.reference`` first, so its
  plan's stand-in measures the machine's per-port cost (``cost.ports``,
  unless already cached); returns the record in use and the reference's
  step (None, None: not measured)."""
  if args.cost != "measured" or not args.reference:
    return None, None
  model = BUILDERS[args.reference](args.rows * args.microbatches)
  step = tj.schedule(model.fn, mesh=mesh, placement=tj.placements.vshape(2),
                     num_microbatches=args.microbatches,
                     has_aux=model.has_aux, cut="auto", cost="measured",
                     seed=args.seed)
  step.build(model.params, model.batch)
  return ({"reference": args.reference,
           **(machine_record(step, mesh) or {})}, step)


def machine_record(step: Any, mesh: Any) -> dict[str, Any] | None:
  """The machine's per-port record in ``step``'s cache now (a later
  model may add a second stand-in to it, ``cost.port_fit``)."""
  fields = step._costs._mesh_fields(mesh, "pipe")  # pylint: disable=protected-access
  return step._costs.cache.get("ports", _ports.port_key(fields))  # pylint: disable=protected-access


def main(args: SpansArgs, log: Callable[[str], None] = print) -> int:
  """Runs every model in this process (2 devices); writes the JSON."""
  mesh = jax.sharding.Mesh(np.array(jax.devices()[:2]), ("pipe",))
  load_start = list(os.getloadavg())
  if args.realtime:
    realtime.realtime_threads()
  try:
    machine, ref_step = calibrate_machine(args, mesh)
  finally:
    realtime.normal_priority()
  if machine is not None:
    log(json.dumps({"machine": machine}))

  def row(name: str) -> dict[str, Any]:
    # At real-time priority from the build on: the kernels and the
    # stand-in programs (``tessel_jax.cost.calibrate``) are timed at the
    # priority the candidates are timed at (at normal priority under
    # load, profiles ran 16-18% slower, see ``inference_speedup_lib``).
    rt = realtime.realtime_threads() if args.realtime else 0
    runs, got, model = build_model(name, args, mesh)
    rt = max(rt, realtime.realtime_threads() if args.realtime else 0)
    for c, t in time_rounds(runs, args.rounds, args.seed).items():
      got[c].update(t)
    if args.price_after:
      priced_again(model, args, mesh, got)
    got["realtime_threads"] = rt
    return judge(got)

  rows = model_zoo_rows.each_model(args.models, row, log)
  end = None if ref_step is None else machine_record(ref_step, mesh)
  if end is not None:
    log(json.dumps({"machine_end": end}))
  model_zoo_rows.write_rows(args, rows, markdown, load_start,
                            {"machine": machine, "machine_end": end}, log)
  return 0
