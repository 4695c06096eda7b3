"""Pipelined inference against the same batch on one device (no flags here).

See ``experiments.inference_speedup``. Worker processes hold the programs,
built once: the unpipelined GPT over the batch (``lax.map`` over the
micro-batches, as ``inference_lib.plain_ms``) on one device pinned to one
core (``plain_1core``, single-threaded XLA) and on one device given both
cores (``plain_2core``: XLA's default CPU flags, so its own thread pool
spreads each op over both cores), and a process of 2 fake single-threaded
CPU devices on both cores holding ``tj.schedule(..., mode="infer",
cost="measured")`` of each placement, its layer groups balanced on the
measured layers (as ``experiments.inference``; a fresh profile cache per
run, so nothing measured earlier is reused). The parameters are put
replicated on the devices once (a served model's weights stay on them).

The workers run at real-time priority (``realtime``: every thread at
``SCHED_RR``, as ``cost_bench``'s workers, profiling and timing alike)
where allowed, so other jobs on a shared machine take at most the 5% the
kernel leaves them.
The parent runs rounds (every variant once per round, shuffled) and keeps
rounds in which the rest of the machine used under ``quiet_cores`` of the
timed worker's cores in each timing (``workers.Worker.time``); if none is
quiet, all are used and the JSON says so. Per variant: median wall and CPU ms, the paired
ratio (per round, then the median) to each plain baseline, and for the
pipelines the predicted step (``report.predicted_step_ms``), the largest
relative error of the outputs against the plain function and (``profile``)
where one step goes by part (``experiments.step_profile``: kernels,
ppermute/rendezvous, stash, switch/loop, pack/unpack, idle).
"""

from __future__ import annotations

import json
import os
import random
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import jax
import numpy as np

import tessel_jax as tj
from experiments import (gpt_profile, realtime, rel_err, runs, step_profile,
                         workers, xla_env)
from tessel_jax import placements as _placements
from tessel_jax.search import plan_graph

PLAIN = ("plain_1core", "plain_2core")
PLACEMENTS = ("vshape", "mllm", "xshape")


class SpeedupArgs(NamedTuple):
  """Everything ``inference_speedup_lib`` needs; see the flags."""

  placements: tuple[str, ...] = PLACEMENTS
  microbatches: int = 8
  vocab: int = 8192
  d_model: int = 128
  layers: int = 6
  heads: int = 4
  seq: int = 64
  rows: int = 8
  rounds: int = 7
  quiet_cores: float = 0.15
  profile_rounds: int = 3
  profile: bool = True
  realtime: bool = True
  seed: int = 0
  output: str | None = "results/inference_speedup/inference_speedup.json"
  worker: str | None = None


def shape_of(args: SpeedupArgs) -> gpt_profile.GPTShape:
  return gpt_profile.GPTShape(vocab=args.vocab, d_model=args.d_model,
                              layers=args.layers, heads=args.heads,
                              seq=args.seq, rows=args.rows)


def xla_flags(worker: str) -> str:
  """The worker's XLA_FLAGS (set before jax starts)."""
  if worker == "plain_2core":
    return "--xla_force_host_platform_device_count=1"
  return " ".join(xla_env.cpu_flags(2 if worker == "pipe" else 1,
                                   single_thread=True))


def _inputs(args: SpeedupArgs) -> tuple[Any, Any]:
  shape = shape_of(args)
  params = gpt_profile.init_params(shape, args.seed)
  batch = gpt_profile.make_batch(shape, args.microbatches * args.rows,
                                 args.seed + 1)
  return params, batch


def plain_program(args: SpeedupArgs) -> tuple[Callable[[], Any], Callable]:
  """``(run, fn)``: the unpipelined batch on device 0 and its function."""
  shape, n = shape_of(args), args.microbatches
  fn = gpt_profile.chain_fn(shape, [(0, args.layers + 2)], output="nll")
  params, batch = jax.device_put(_inputs(args), jax.devices()[0])
  mbs = jax.tree_util.tree_map(lambda x: x.reshape((n, -1) + x.shape[1:]),
                               batch)
  f = jax.jit(lambda p, b: jax.lax.map(lambda mb: fn(p, mb), b).reshape(-1))
  return (lambda: f(params, mbs)), fn


def pipe_program(name: str, args: SpeedupArgs, model: Any, mesh: Any
                 ) -> tuple[Callable[[], Any], dict[str, Any]]:
  """``(run, row)``: one placement's inference program on ``mesh``."""
  shape, n = shape_of(args), args.microbatches
  graph = _placements.get(name, 2, mode="infer")
  slot_of, num_groups = plan_graph.slots(graph, name)
  groups = plan_graph.group_layers([l.forward_s for l in model.layers],
                                   graph, slot_of, num_groups)
  fn = gpt_profile.model_fn(name, shape, groups, output="nll")
  params, batch = _inputs(args)
  step = tj.schedule(fn, mesh=mesh, placement=graph, num_microbatches=n,
                     mode="infer", cost="measured", seed=args.seed)
  t0 = time.perf_counter()
  built = step.build(params, batch)
  build_s = time.perf_counter() - t0
  rep = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())
  params, batch = jax.device_put((params, batch), rep)
  t0 = time.perf_counter()
  compiled = built.jitted.lower(params, batch).compile()
  compile_s = time.perf_counter() - t0
  row = {"variant": name, "groups": [list(g) for g in groups],
         "lowered_as": built.plan.loop_summary(),
         "schedule_source": built.unrolled.source,
         "makespan_steps": built.unrolled.makespan,
         "predicted_ms": round(built.report.predicted_step_ms, 3),
         "block_ms": {k: round(v, 3) for k, v in
                      built.report.block_ms.items()},
         "build_s": round(build_s, 3), "compile_s": round(compile_s, 3)}
  row["hlo"] = compiled.as_text()
  return (lambda: compiled(params, batch)), row



def worker(args: SpeedupArgs) -> int:
  """Builds this process's programs, then answers ``time NAME`` lines."""
  runs: dict[str, Callable[[], Any]] = {}
  built: list[dict[str, Any]] = []
  # At real-time priority from the start (threads made later inherit it):
  # the layers and blocks are profiled as fast as the timed program runs.
  # Profiled at normal priority under a load average of 20, the kernels ran
  # 16-18% slower than inside the program timed at real-time priority.
  got = realtime.realtime_threads() if args.realtime else 0
  if args.worker in PLAIN:
    runs[args.worker], _ = plain_program(args)
    built.append({"variant": args.worker})
  else:
    mesh = jax.sharding.Mesh(np.array(jax.devices()[:2]), ("pipe",))
    model = gpt_profile.profile_layers(shape_of(args), mode="infer",
                                       rounds=args.profile_rounds,
                                       seed=args.seed)
    with jax.default_device(jax.devices()[0]):
      want = np.asarray(plain_program(args)[0]())
    for name in args.placements:
      run, row = pipe_program(name, args, model, mesh)
      row["max_rel_err"] = rel_err.max_rel(run(), want)
      row["layer_ms"] = {l.name: round(l.forward_s * 1e3, 3)
                         for l in model.layers}
      runs[name] = run
      built.append(row)
  for run in runs.values():
    jax.block_until_ready(run())
  got = max(got, realtime.realtime_threads() if args.realtime else 0)
  for row in built:  # profiled at the timing's priority
    hlo = row.pop("hlo", None)
    if args.profile and hlo is not None:
      row["profile"] = step_profile.profile_step(runs[row["variant"]], hlo,
                                                 2, 3)
    print(json.dumps({"built": row}), flush=True)
  print(json.dumps({"ready": True, "realtime_threads": got}), flush=True)
  workers.serve(runs)
  return 0


def _start(kind: str, cores: Sequence[int], args: SpeedupArgs,
           cache_dir: str, log: Callable[[str], None]) -> workers.Worker:
  """One worker process on ``cores`` with its XLA flags and ``cache_dir``
  as its tessel_jax cache."""
  cmd = [sys.executable, "-m", "experiments.inference_speedup",
         f"--worker={kind}", f"--placements={','.join(args.placements)}",
         f"--microbatches={args.microbatches}", f"--vocab={args.vocab}",
         f"--d_model={args.d_model}", f"--layers={args.layers}",
         f"--heads={args.heads}", f"--seq={args.seq}",
         f"--rows={args.rows}", f"--profile_rounds={args.profile_rounds}",
         f"--{'' if args.profile else 'no'}profile",
         f"--{'' if args.realtime else 'no'}realtime",
         f"--seed={args.seed}", "--output="]
  env = dict(os.environ, XLA_FLAGS=xla_flags(kind), JAX_PLATFORMS="cpu",
             TESSEL_JAX_CACHE=cache_dir)
  return workers.Worker(f"inference_speedup worker {kind}", cmd, cores, env,
                        log)


def rounds(procs: dict[str, workers.Worker], names: Sequence[str],
           args: SpeedupArgs, log: Callable[[str], None]) -> list[dict]:
  """Every variant once per round, shuffled; ``others_cores`` per timing."""
  rng = random.Random(args.seed)
  out = []
  for r in range(args.rounds):
    order = list(names)
    rng.shuffle(order)
    times, worst = {}, 0.0
    for name in order:
      res = procs[name if name in PLAIN else "pipe"].time(name)
      worst = max(worst, res["others_cores"])
      times[name] = res
    quiet = worst < args.quiet_cores
    out.append({"round": r, "quiet": quiet,
                "worst_others_cores": round(worst, 3), "times": times,
                "load_average": list(os.getloadavg())})
    log(f"round {r}: {'quiet' if quiet else 'busy'} (others up to"
        f" {worst:.2f} cores)")
  return out


def summarise(rounds_: list[dict], names: Sequence[str]) -> dict[str, Any]:
  """Medians over the kept rounds and paired ratios to the plain runs."""
  quiet = [r for r in rounds_ if r["quiet"]]
  kept = quiet or rounds_
  rows = {}
  for name in names:
    walls = [r["times"][name]["wall_s"] for r in kept]
    cpus = [r["times"][name]["cpu_s"] for r in kept]
    row = {"wall_ms": round(1e3 * statistics.median(walls), 2),
           "cpu_ms": round(1e3 * statistics.median(cpus), 2)}
    for ref in PLAIN:
      ratios = [r["times"][name]["wall_s"] / r["times"][ref]["wall_s"]
                for r in kept if ref in r["times"]]
      row[f"vs_{ref}"] = round(statistics.median(ratios), 3) if ratios else None
    rows[name] = row
  return {"rounds_kept": len(kept), "rounds_quiet": len(quiet),
          "kept_busy_rounds": not quiet, "rows": rows}


def markdown(built: list[dict], summary: dict[str, Any]) -> str:
  """One line per variant."""
  by = {b["variant"]: b for b in built}
  lines = ["| variant | lowered as | wall ms | CPU ms | x plain 1 core |"
           " x plain 2 cores | predicted ms | measured / predicted |"
           " max rel. err |", "|---|---|---|---|---|---|---|---|---|"]
  for name, r in summary["rows"].items():
    b = by.get(name, {})
    pred = b.get("predicted_ms")
    ratio = f"{r['wall_ms'] / pred:.2f}" if pred else "-"
    err = f"{b['max_rel_err']:.1e}" if "max_rel_err" in b else "-"
    lines.append(
        f"| {name} | {b.get('lowered_as', 'jit, 1 device')} |"
        f" {r['wall_ms']:.1f} | {r['cpu_ms']:.1f} | {r['vs_plain_1core']} |"
        f" {r['vs_plain_2core']} | {pred if pred else '-'} | {ratio} |"
        f" {err} |")
  profiled = [b for b in built if "profile" in b]
  if profiled:
    parts = list(step_profile.PARTS) + ["idle"]
    lines += ["", "Where a pipelined step goes (XLA's trace, ms per device;"
              " `experiments.step_profile`):", "",
              "| variant | step ms | " + " | ".join(parts) + " | busy |",
              "|---|---|" + "---|" * (len(parts) + 1)]
    for b in profiled:
      p = b["profile"]
      lines.append(f"| {b['variant']} | {p['wall_ms']:.1f} | " + " | ".join(
          f"{p[k]:.1f}" for k in parts) + f" | {100 * p['busy_share']:.0f}% |")
  return "\n".join(lines)


def main(args: SpeedupArgs) -> int:
  if args.worker is not None:
    return worker(args)
  log = lambda s: print(s, flush=True)
  cores = sorted(os.sched_getaffinity(0))[:2]
  if len(cores) < 2:
    raise RuntimeError("inference_speedup needs 2 cores (pipe worker)")
  kinds = {"plain_1core": cores[:1], "plain_2core": cores, "pipe": cores}
  procs: dict[str, workers.Worker] = {}
  load_start = list(os.getloadavg())
  # A fresh profile cache: every run measures the layers and blocks anew.
  cache = tempfile.TemporaryDirectory(prefix="tessel_speedup_cache_")
  try:
    for k, c in kinds.items():  # one at a time: builds do not share cores
      procs[k] = _start(k, c, args, cache.name, log)
    names = list(PLAIN) + list(args.placements)
    rounds_ = rounds(procs, names, args, log)
  finally:
    for w in procs.values():
      w.close()
    cache.cleanup()
  built = [b for w in procs.values() for b in w.built]
  summary = summarise(rounds_, names)
  table = markdown(built, summary)
  record = {"args": args._asdict(), "cores": cores, "built": built,
            "realtime_threads": {k: w.ready["realtime_threads"]
                                 for k, w in procs.items()},
            "summary": summary, "rounds": rounds_, "table": table,
            "load_average_start": load_start,
            "load_average_end": list(os.getloadavg())}
  log(table)
  log(f"{summary['rounds_quiet']} of {len(rounds_)} rounds quiet (others"
      f" under {args.quiet_cores} cores); load average {load_start} ->"
      f" {record['load_average_end']}")
  if args.output:
    runs.write_record(args.output, record, table)
  return 0
