"""The compact-lowering benchmark (no flags here); see ``experiments.compact_bench``."""

from __future__ import annotations

import json
import os
import random
import time
from collections.abc import Callable
from typing import Any

import jax
import numpy as np

import tessel_jax as tj
from experiments import lowering_bench_lib as lb
from experiments import peer_bench_lib as pb
from experiments import peer_gpipe as pg
from experiments import realtime, runs, workers
from experiments import train_lib
from tessel_jax import placements
from tessel_jax.passes import held

VARIANTS = (("default", 8, True), ("compact", 0, True),
            ("compact_every_boundary", 0, False))


def _model(name: str, n: int) -> tuple[Callable, Any, Any, Any]:
  """``(loss, placement, params, batch)`` of the benchmark's model."""
  if name == "mlp":
    loss = pb.marked_loss([2, 2])
    return (loss, placements.vshape(2), pg.mlp_params(4, 1024, 0),
            lb.make_batch(n * 256, 1024, 1))
  a = train_lib.TrainArgs()
  graph = placements.get("mshape", 4)
  blocks = sum(1 for b in graph.blocks if b.kind == "F")
  data = train_lib.CharData(train_lib.corpus(), a.seq, a.seed)
  params = train_lib.init_params(jax.random.PRNGKey(a.seed), data.vocab,
                                 a.d_model, a.layers, a.seq)
  return (train_lib.make_loss_fn(blocks, a.layers, a.heads), graph, params,
          data.batch(n * a.microbatch_size))


def _err(out: Any, ref: Any) -> float:
  return max(float(np.max(np.abs(np.asarray(x) - np.asarray(y))) /
                   (np.max(np.abs(np.asarray(y))) + 1e-30))
             for x, y in zip(jax.tree_util.tree_leaves(out),
                             jax.tree_util.tree_leaves(ref)))


def _build(model: str, n: int, ramps: int, hold: bool
           ) -> tuple[Callable[[], Any], dict[str, Any]]:
  """One variant: compiled, checked; its timed call and figures."""
  loss, graph, params, batch = _model(model, n)
  mesh = jax.make_mesh((graph.num_devices,), ("pipe",))
  original = held.flush_points
  if not hold:  # every message sent at the boundary after its tick
    held.flush_points = lambda intervals, b: np.ones(b, bool)
  try:
    step = tj.schedule(loss, mesh=mesh, placement=graph, num_microbatches=n,
                       cut="markers" if model == "mlp" else None,
                       interpret_ramps=ramps, seed=0,
                       optimizer_slots=0 if model == "mlp" else 2)
    built = step.build(params, batch)
  finally:
    held.flush_points = original
  t0 = time.perf_counter()
  compiled = step.lower(params, batch).compile()
  compile_s = time.perf_counter() - t0
  err = _err(compiled(params, batch),
             jax.jit(jax.value_and_grad(loss))(params, batch))
  if err > 1e-5:
    raise AssertionError(f"{model} ramps={ramps}: rel err {err:.1e}")
  interps = list(built.plan.interps.values())
  flushes = [int(np.any([rd.flush[:, 0] for rd in t.sends if rd.remote]
                        or [[0]], axis=0).sum()) for t in interps]
  row = {"segments": built.plan.loop_summary(),
         "compile_s": round(compile_s, 2),
         "hlo_kchars": round(len(compiled.as_text()) / 1e3),
         "interp_ticks": [int(t.branch_of.shape[0]) for t in interps],
         "flush_boundaries": flushes, "rel_err": err}
  return (lambda: jax.block_until_ready(compiled(params, batch))), row


def _time(calls: dict[str, Callable[[], Any]], repeats: int, rt: bool
          ) -> dict[str, dict[str, float]]:
  """Median wall and CPU ms per call, variants interleaved and shuffled."""
  if rt:
    for tid in os.listdir("/proc/self/task"):
      try:
        os.sched_setaffinity(int(tid), {0, 1})
      except OSError:
        pass
    realtime.realtime_threads()
  wall = {k: [] for k in calls}
  cpu = {k: [] for k in calls}
  rng = random.Random(0)
  try:
    for _ in range(repeats):
      order = list(calls)
      rng.shuffle(order)
      for k in order:
        t0, c0 = time.perf_counter(), workers.cpu_s()
        calls[k]()
        wall[k].append(time.perf_counter() - t0)
        cpu[k].append(workers.cpu_s() - c0)
  finally:
    realtime.normal_priority()
  return {k: {"wall_ms": round(1e3 * float(np.median(wall[k])), 1),
              "cpu_ms": round(1e3 * float(np.median(cpu[k])), 1)}
          for k in calls}


def main(args: Any) -> int:
  ns = args.ns if args.model == "mlp" else (16,)
  results = {"runner": "compact_bench", "args": args._asdict(),
             "environment": runs.environment()}
  results["load_before"] = os.getloadavg()
  rows = []
  for n in ns:
    calls, built = {}, {}
    for name, ramps, hold in VARIANTS:
      calls[name], built[name] = _build(args.model, n, ramps, hold)
      calls[name]()
      print(f"N={n} {name}: {built[name]}", flush=True)
    times = _time(calls, args.repeats, args.realtime)
    base = times["default"]["wall_ms"]
    for name in calls:
      row = {"n": n, "variant": name, **built[name], **times[name],
             "wall_x_default": round(times[name]["wall_ms"] / base, 3)}
      rows.append(row)
      print(f"N={n} {name}: wall {row['wall_ms']} ms, CPU {row['cpu_ms']}"
            f" ms, {row['wall_x_default']}x default", flush=True)
  results["rows"] = rows
  results["realtime"] = args.realtime
  results["load_after"] = os.getloadavg()
  print(f"load {results['load_before']} -> {results['load_after']}")
  if args.output:
    runs.write_text(args.output, json.dumps(results, indent=1) + "\n")
    print("results:", args.output)
  return 0
