"""The cost-model benchmark (no flags here); see ``experiments.cost_bench``.

Parts:

* ``accuracy``: predicted against measured step time on 2 single-threaded
  fake CPU devices, one core each (the setup of ``lowering_bench``'s
  speed-up part, whose model and timing helpers are reused), for each
  placement x micro-batch count; each case runs in its own worker process.
* ``profiling``: seconds spent profiling a small GPT (``train_lib``'s
  model, one block per layer) with a cold cache and again with the cache
  filled.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import numpy as np

import tessel_jax as tj
from experiments import lowering_bench_lib, train_lib
from experiments import realtime as realtime_
from tessel_jax import placements

PARTS = ("accuracy", "profiling")
TARGET_RATIO = 0.15      # |predicted / measured - 1| within this
TARGET_COLD_S = 20.0     # profiling a 12-layer GPT with a cold cache


class CostBenchArgs(NamedTuple):
  """Everything ``cost_bench_lib`` needs; see the flags for meanings."""

  parts: tuple[str, ...] = PARTS
  placements: tuple[str, ...] = ("vshape", "mshape")
  microbatches: tuple[int, ...] = (8, 32)
  hidden: int = 512
  rows: int = 128
  layers_per_block: int = 2
  repeats: int = 11
  gpt_layers: int = 12
  gpt_devices: int = 4
  gpt_d_model: int = 64
  cache_dir: str | None = None
  shared_cache: bool = False
  realtime: bool = True
  output: str | None = "out/cost_bench.json"
  worker: str | None = None


# --- accuracy ---------------------------------------------------------------


def accuracy_case(placement: str, n: int, args: Any) -> dict[str, Any]:
  """One case in this process (2 single-threaded devices, set by the
  binary): build with measured costs, compile, time the step."""
  graph = placements.get(placement, 2)
  nb = sum(1 for b in graph.blocks if b.kind == "F")
  fn, params = lowering_bench_lib.chain_model(nb, args.hidden,
                                              args.layers_per_block)
  batch = lowering_bench_lib.make_batch(n * args.rows, args.hidden)
  mesh = jax.make_mesh((2,), ("pipe",))
  step = tj.schedule(fn, mesh=mesh, placement=graph, num_microbatches=n,
                     cost="measured", cache_dir=args.cache_dir)
  t0 = time.perf_counter()
  built = step.build(params, batch)
  build_s = time.perf_counter() - t0
  compiled = step.lower(params, batch).compile()
  wall, cpu = lowering_bench_lib._median_run(  # pylint: disable=protected-access
      lambda: compiled(params, batch), args.repeats)
  rep = built.report
  measured_ms = wall * 1e3
  return {
      "placement": graph.name, "n": n, "devices": len(jax.devices()),
      "realtime": realtime_.realtime_now(),
      "predicted_ms": round(rep.predicted_step_ms, 3),
      "measured_ms": round(measured_ms, 3),
      "ratio": round(rep.predicted_step_ms / measured_ms, 4),
      "measured_cpu_ms": round(cpu * 1e3, 3),
      "quantization_error": (None if rep.quantization_error is None else
                             round(rep.quantization_error, 4)),
      "schedule_costs": rep.schedule_costs,
      "alternative_ms": (None if rep.alternative_ms is None else
                         round(rep.alternative_ms, 3)),
      "block_error": round(rep.block_error, 4),
      "time_resolution_ms": round(rep.time_resolution_s * 1e3, 4),
      "bubble_ratio": round(rep.bubble_ratio, 4),
      "tick_overhead_ms": round(rep.tick_overhead_ms, 4),
      "barrier_ms": round(rep.barrier_ms, 4),
      "ticks": rep.ticks, "lowered_as": built.plan.loop_summary(),
      "makespan_steps": built.unrolled.makespan,
      "block_ms": {k: round(v, 4) for k, v in rep.block_ms.items()},
      "block_core_ms": {k.label: round(k.core_seconds * 1e3, 4)
                        for k in built.profile.kernels.values()},
      "block_alone_ms": {k.label: round(k.seconds * 1e3, 4)
                         for k in built.profile.kernels.values()},
      "spans": {b.label: b.span for b in built.graph.blocks},
      "profile_seconds": round(rep.profile_seconds, 3),
      "build_seconds": round(build_s, 3),
  }


def _run_worker(placement: str, n: int, args: Any) -> dict[str, Any]:
  cmd = [sys.executable, "-m", "experiments.cost_bench",
         f"--worker={placement}:{n}", f"--hidden={args.hidden}",
         f"--rows={args.rows}", f"--layers_per_block={args.layers_per_block}",
         f"--repeats={args.repeats}", f"--cache_dir={args.cache_dir or ''}",
         "--output="]
  env = dict(os.environ)
  env.pop("XLA_FLAGS", None)
  # One core per device, as lowering_bench's speed-up part (XLA's CPU
  # runtime runs independent work on more threads otherwise).
  cores = sorted(os.sched_getaffinity(0))[:2]
  realtime = args.realtime

  def setup() -> None:
    os.sched_setaffinity(0, cores)
    if realtime:  # the worker reports what it got
      realtime_.realtime_process()

  proc = subprocess.run(cmd, capture_output=True, text=True, env=env,
                        check=False, preexec_fn=setup)
  lines = [l for l in proc.stdout.splitlines() if l.startswith("{")]
  if proc.returncode or not lines:
    raise RuntimeError(f"cost_bench worker {placement}:{n} failed:\n"
                       f"{proc.stderr[-4000:]}")
  return json.loads(lines[-1]) | {"cores": cores}


def part_accuracy(args: Any, log: Callable[[str], None]) -> dict[str, Any]:
  rows = []
  for placement in args.placements:
    for n in args.microbatches:
      # Each case profiles afresh (its own cache directory) unless a cache
      # was given: the profile and the timed steps then see the same
      # machine (on a shared machine its speed drifts between minutes).
      case_args = args
      if not args.shared_cache:
        case_args = args._replace(cache_dir=os.path.join(
            args.cache_dir, f"{placement}_{n}"))
      row = _run_worker(placement, n, case_args)
      row["within_target"] = abs(row["ratio"] - 1) <= TARGET_RATIO
      rows.append(row)
      log(f"accuracy {row['placement']} N={n}: predicted"
          f" {row['predicted_ms']:.1f} ms, measured {row['measured_ms']:.1f}"
          f" ms, ratio {row['ratio']:.3f} (schedule searched on"
          f" {row['schedule_costs']} spans, quantisation error"
          f" {_pct(row['quantization_error'])}, {row['ticks']} ticks)")
  worst = max(abs(r["ratio"] - 1) for r in rows) if rows else 0.0
  return {"model": {"hidden": args.hidden, "rows_per_microbatch": args.rows,
                    "layers_per_block": args.layers_per_block},
          "realtime": bool(rows and rows[0]["realtime"]),
          "rows": rows, "worst_abs_error": round(worst, 4),
          "target": TARGET_RATIO, "load_average": os.getloadavg(),
          "cpu_count": os.cpu_count()}


# --- profiling cost ---------------------------------------------------------


def gpt_case(args: Any) -> tuple[Any, Any, Any, Any]:
  """``train_lib``'s GPT with one block per layer (embedding alone first)
  on a hand placement over ``gpt_devices`` devices: block 0 (embedding)
  shared by all devices, layer ``i`` on device ``i mod D``."""
  layers, d = args.gpt_layers, args.gpt_devices
  data = train_lib.CharData(train_lib.corpus(), 32, 0)
  params = train_lib.init_params(jax.random.PRNGKey(0), data.vocab,
                                 args.gpt_d_model, layers, 32)
  loss_fn = train_lib.make_loss_fn(layers + 1, layers, 4)
  devices = [tuple(range(d))] + [(i % d,) for i in range(layers)]
  placement = tj.Placement(devices, name="gpt_layers")
  batch = data.batch(8 * 4)
  mesh = jax.make_mesh((d,), ("pipe",))
  return loss_fn, params, batch, (placement, mesh)


def part_profiling(args: Any, log: Callable[[str], None]) -> dict[str, Any]:
  loss_fn, params, batch, (placement, mesh) = gpt_case(args)
  out: dict[str, Any] = {"layers": args.gpt_layers,
                         "devices": args.gpt_devices,
                         "d_model": args.gpt_d_model,
                         "target_cold_s": TARGET_COLD_S}
  with tempfile.TemporaryDirectory(prefix="tessel_cost_bench_") as tmp:
    for run in ("cold", "cached"):
      step = tj.schedule(loss_fn, mesh=mesh, placement=placement,
                         num_microbatches=8, cost="measured", cache_dir=tmp)
      t0 = time.perf_counter()
      built = step.build(params, batch)
      build_s = time.perf_counter() - t0
      rep = built.report
      out[run] = {"profile_seconds": round(rep.profile_seconds, 3),
                  "kernels": len(built.kernels.kernels),
                  "kernels_measured": rep.kernels_measured,
                  "cache_hit": rep.cache_hit,
                  "build_seconds": round(build_s, 3),
                  "predicted_step_ms": round(rep.predicted_step_ms, 3)}
      log(f"profiling {run}: {out[run]}")
  out["cold_within_target"] = out["cold"]["profile_seconds"] <= TARGET_COLD_S
  return out


# --- main -------------------------------------------------------------------


def _pct(x: float | None) -> str:
  return "n/a" if x is None else f"{100 * x:.1f}%"


def table(record: dict[str, Any]) -> str:
  """Markdown table of the accuracy rows and the profiling figures."""
  lines = []
  acc = record.get("accuracy")
  if acc:
    lines += ["| placement | N | predicted ms | measured ms | ratio |"
              " spans searched | quantisation error | ticks |",
              "|---|---|---|---|---|---|---|---|"]
    for r in acc["rows"]:
      lines.append(f"| {r['placement']} | {r['n']} | {r['predicted_ms']:.1f}"
                   f" | {r['measured_ms']:.1f} | {r['ratio']:.3f} |"
                   f" {r['schedule_costs']} |"
                   f" {_pct(r['quantization_error'])} | {r['ticks']} |")
  prof = record.get("profiling")
  if prof:
    lines += ["", "| GPT profiling | seconds | kernels measured | cache hit |",
              "|---|---|---|---|"]
    for run in ("cold", "cached"):
      r = prof[run]
      lines.append(f"| {run} | {r['profile_seconds']:.2f} |"
                   f" {r['kernels_measured']} / {r['kernels']} |"
                   f" {r['cache_hit']} |")
  return "\n".join(lines)


def main(args: Any) -> int:
  if args.worker is not None:
    placement, n = args.worker.split(":")
    print(json.dumps(accuracy_case(placement, int(n), args)))
    return 0
  log = lambda s: print(s, flush=True)
  record: dict[str, Any] = {"jax": jax.__version__,
                            "numpy": np.__version__}
  with tempfile.TemporaryDirectory(prefix="tessel_cost_cache_") as tmp:
    if args.cache_dir is None:
      args = args._replace(cache_dir=tmp)
    else:
      args = args._replace(shared_cache=True)
    for part in args.parts:
      record[part] = {"accuracy": part_accuracy,
                      "profiling": part_profiling}[part](args, log)
  print(table(record))
  text = json.dumps(record, indent=1)
  if args.output:
    os.makedirs(os.path.dirname(args.output) or ".", exist_ok=True)
    with open(args.output, "w") as f:
      f.write(text)
    print(f"results: {args.output}")
  return 0
