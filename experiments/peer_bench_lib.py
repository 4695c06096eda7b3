"""The peer benchmark (no flags here); see ``experiments.peer_bench``.

Three worker processes hold the variants, built once (first call, compile,
memory, HLO size measured there): plain ``jax.jit`` on one device pinned to
one core, the same given both cores, and a process of ``stages`` fake
devices on both cores (data parallel, the hand-written GPipe of
``experiments.peer_gpipe``, and tessel_jax's programs: searched,
``plan="gpipe"`` and ``plan="1f1b"`` on ``vshape``, searched on ``mshape``
and ``zbv``), spoken to through ``experiments.workers``. The parent then
runs rounds: every (variant, N) once per round in shuffled order, reading
``/proc/stat`` around each timing; a round counts only when, in every one
of its timings, the CPU the rest of the machine used on the worker's cores
(busy jiffies minus the worker's own CPU time) stayed under
``quiet_cores``.
"""

from __future__ import annotations

import dataclasses
import json
import os
import random
import re
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

import tessel_jax as tj
from experiments import hlo_breakdown, hlo_count, runs, workers
from experiments import lowering_bench_lib as lb
from experiments import peer_gpipe as pg
from tessel_jax import placements
from tessel_jax.passes import switches

VARIANTS = ("plain_1core", "plain_2core", "data_parallel", "hand_gpipe",
            "tj_searched", "tj_gpipe", "tj_1f1b", "tj_compact", "tj_mshape",
            "tj_zbv", "tj_mshape_compact", "tj_zbv_compact",
            "tj_compact_sepwrites")
# The default variants: issue 15's 2-stage table, and at 4 stages its work
# ratio (searched mshape and zbv against the hand GPipe; plain jit on one
# core is the useful work, tessel_jax's GPipe the same placement as the hand
# one).
DEFAULT_VARIANTS = {2: VARIANTS[:8],
                    4: ("plain_1core", "hand_gpipe", "tj_gpipe", "tj_mshape",
                        "tj_zbv")}
MAXTEXT_SKIP = ("MaxText is not installed here; it stays an optional peer"
                " (its wheel wants Python >= 3.12 and jax >= 0.11.1, see"
                " issue 15), so its row is skipped")


class PeerArgs(NamedTuple):
  """Everything ``peer_bench_lib`` needs; see the flags for meanings."""

  hidden: int = 1024
  layers: int = 4
  stages: int = 2
  rows: int = 256
  ns: tuple[int, ...] = (8, 32)
  rounds: int = 7
  quiet_cores: float = 0.15
  cost: str = "measured"
  variants: tuple[str, ...] = VARIANTS
  seed: int = 0
  output: str | None = "results/peer_bench/peer_bench.json"
  worker: str | None = None


# --- the worker: builds its variants, then times on request -------------------


def _hlo_stats(compiled: Any, args: PeerArgs) -> dict[str, Any]:
  """XLA temp bytes, HLO size (with and without the op_name metadata,
  which grows with name scopes) and parameter-sized work per place
  (``experiments.hlo_count``: adds, copies, selects, zero fills of the
  layers' (stacked or single) weight and bias shapes)."""
  ma = compiled.memory_analysis()
  text = compiled.as_text()
  h, per = args.hidden, args.layers // args.stages
  shapes = [(h, h), (h,), (per, h, h), (per, h), (1, per, h, h), (1, per, h)]
  bare = re.sub(r", metadata=\{[^}]*\}", "", text)
  return {"temp_bytes": int(ma.temp_size_in_bytes), "hlo_chars": len(text),
          "hlo_chars_no_metadata": len(bare),
          "param_ops": hlo_count.param_ops(text, shapes)}


def marked_loss(block_layers: Sequence[int]) -> Callable[[Any, Any], Any]:
  """The MLP loss of ``experiments.peer_gpipe`` (same parameters), with a
  ``tj.boundary`` after each block of ``block_layers[i]`` layers."""

  def loss(params: list[dict[str, Any]], batch: Any) -> Any:
    h, i = batch["x"], 0
    for b, count in enumerate(block_layers):
      for p in params[i:i + count]:
        h = jnp.tanh(h @ p["w"] + p["b"])
      i += count
      if b + 1 < len(block_layers):
        h = tj.boundary(h)
    return jnp.mean((h - batch["y"]) ** 2)
  return loss


def tj_layout(name: str, layers: int, stages: int
              ) -> tuple[Any, list[int]]:
  """``(placement, layers per forward block)`` of a tessel_jax variant.

  ``vshape(S)`` (searched, GPipe, 1F1B, compact) holds ``L / S`` layers per
  stage as the hand GPipe does; ``mshape(S)`` runs the first half of the
  layers on all ``S`` devices (rows split) and then ``L / 2S`` per device;
  ``zbv(S)`` chains ``2S`` blocks of ``L / 2S``, two per device. Every
  device does ``L / S`` layers of work per micro-batch in each.
  """
  if name.startswith("tj_mshape"):
    return (placements.mshape(stages),
            [layers // 2] + [layers // (2 * stages)] * stages)
  if name.startswith("tj_zbv"):
    return placements.zbv(stages), [layers // (2 * stages)] * (2 * stages)
  return placements.vshape(stages), [layers // stages] * stages


def _variant_fns(name: str, n: int, args: PeerArgs) -> tuple[Callable, Any]:
  """``(make, inputs)``: ``make()`` returns a fresh callable on ``inputs``."""

  params = pg.mlp_params(args.layers, args.hidden, args.seed)
  batch = lb.make_batch(n * args.rows, args.hidden, args.seed + 1)
  auto = (jax.sharding.AxisType.Auto,)
  if name.startswith("plain"):
    return (lambda: jax.jit(jax.value_and_grad(pg.plain_loss(n))),
            (params, batch))
  mesh = jax.make_mesh((args.stages,), ("pipe",), axis_types=auto)
  if name == "data_parallel":
    return lambda: pg.data_parallel_step(mesh, "pipe", n), (params, batch)
  if name == "hand_gpipe":
    return (lambda: pg.gpipe_step(mesh, "pipe", n),
            (pg.stack_stages(params, args.stages), batch))
  placement, blocks = tj_layout(name, args.layers, args.stages)
  plan = "gpipe" if name == "tj_gpipe" else "1f1b" if name == "tj_1f1b" else None
  # tj_compact: the searched schedule with every tick in one table-driven
  # loop (interpret_ramps=0: each kernel body once in the program).
  # The ``*_compact`` variants are mshape/zbv lowered the same way (the
  # library's default, interpret_ramps="auto").
  # ``tj_compact_sepwrites``: tj_compact with each kernel's messages
  # written in a loop of their own at the next boundary
  # (``Switches.writes_in_loops`` off), for paired A/B.
  ramps = 0 if "_compact" in name else 8
  sw = (dataclasses.replace(switches.from_env(), writes_in_loops=False)
        if name == "tj_compact_sepwrites" else None)
  return (lambda: tj.schedule(marked_loss(blocks), mesh=mesh,
                              placement=placement, num_microbatches=n,
                              plan=plan, cut="markers", cost=args.cost,
                              interpret_ramps=ramps, switches=sw),
          (params, batch))


def _build(name: str, n: int, args: PeerArgs) -> tuple[Callable, dict]:
  """First call, compile and HLO figures of one variant; its timed call."""
  make, inputs = _variant_fns(name, n, args)
  t0, c0 = time.perf_counter(), workers.cpu_s()
  f = make()
  jax.block_until_ready(f(*inputs))
  first_s, first_cpu = time.perf_counter() - t0, workers.cpu_s() - c0
  if name.startswith("tj_"):
    built = f.build(*inputs)
    jitted = built.jitted
    extra = {"lowered_as": built.plan.loop_summary(),
             "makespan": built.unrolled.makespan}
  else:
    jitted, extra = f, {}
  # A fresh jit of the same program: lowering and compiling again, timed.
  # (a new function object, so no cache of the first call answers).
  inner = jitted.__wrapped__
  fresh = jax.jit(lambda *a: inner(*a))
  t0 = time.perf_counter()
  lowered = fresh.lower(*inputs)
  lower_s = time.perf_counter() - t0
  t0, c0 = time.perf_counter(), workers.cpu_s()
  compiled = lowered.compile()
  compile_s, compile_cpu = time.perf_counter() - t0, workers.cpu_s() - c0
  row = {"variant": name, "n": n, "first_call_s": round(first_s, 3),
         "first_call_cpu_s": round(first_cpu, 3),
         "lower_s": round(lower_s, 3), "compile_s": round(compile_s, 3),
         "compile_cpu_s": round(compile_cpu, 3),
         **_hlo_stats(compiled, args), **extra}
  if name.startswith("tj_"):
    row["hlo_breakdown"] = hlo_breakdown.breakdown(built, compiled.as_text())
  return (lambda: jax.block_until_ready(compiled(*inputs))), row


def worker(args: PeerArgs) -> int:
  """Builds this process's variants, then answers ``time NAME N`` lines."""
  names = [v for v in args.variants
           if (v.startswith("plain") and args.worker.startswith("plain")
               and v == args.worker)
           or (args.worker == "pipe" and not v.startswith("plain"))]
  runs = {}
  for name in names:
    for n in args.ns:
      run, row = _build(name, n, args)
      run()  # one warm call
      runs[f"{name} {n}"] = run
      print(json.dumps({"built": row}), flush=True)
  print(json.dumps({"ready": True}), flush=True)
  workers.serve(runs)
  return 0


# --- the parent: starts workers, runs the rounds ------------------------------


def _start(kind: str, cores: Sequence[int], args: PeerArgs,
           log: Callable[[str], None]) -> workers.Worker:
  """One worker process on ``cores`` (its XLA flags set by the binary)."""
  cmd = [sys.executable, "-m", "experiments.peer_bench", f"--worker={kind}",
         f"--hidden={args.hidden}", f"--layers={args.layers}",
         f"--stages={args.stages}",
         f"--rows={args.rows}", f"--ns={','.join(map(str, args.ns))}",
         f"--cost={args.cost}", f"--seed={args.seed}",
         f"--variants={','.join(args.variants)}", "--output="]
  env = dict(os.environ)
  env.pop("XLA_FLAGS", None)
  codegen = codegen_flags(os.environ.get("XLA_FLAGS", ""))
  if codegen:
    env["XLA_FLAGS"] = codegen
  return workers.Worker(f"peer_bench worker {kind}", cmd, cores, env, log)


# XLA_FLAGS a worker inherits: how the CPU code is generated. Its device
# count and threads are set by the binary.
_CODEGEN_FLAGS = ("--xla_backend_optimization_level",
                  "--xla_cpu_use_fusion_emitters")


def codegen_flags(xla_flags: str) -> str:
  """The code-generation flags of ``xla_flags`` (``_CODEGEN_FLAGS``), the
  ones a worker inherits: a test runs the workers with the suite's
  fast-compile flags (tests/conftest.py); a benchmark sets none."""
  return " ".join(f for f in xla_flags.split()
                  if f.startswith(_CODEGEN_FLAGS))


def _rounds(procs: dict[str, workers.Worker], cases: list[tuple[str, int]],
            args: PeerArgs, log: Callable[[str], None]) -> list[dict]:
  owner = {c: ("pipe" if not c[0].startswith("plain") else c[0])
           for c in cases}
  rng = random.Random(args.seed)
  out = []
  for r in range(args.rounds):
    order = list(cases)
    rng.shuffle(order)
    times, worst = {}, 0.0
    for name, n in order:
      res = procs[owner[(name, n)]].time(name, n)
      worst = max(worst, res["others_cores"])
      times[f"{name}@{n}"] = res
    quiet = worst < args.quiet_cores
    out.append({"round": r, "quiet": quiet, "worst_others_cores":
                round(worst, 3), "times": times})
    log(f"round {r}: {'quiet' if quiet else 'busy'} (others up to"
        f" {worst:.2f} cores)")
  return out


def summarise(rounds: list[dict], cases: list[tuple[str, int]],
              use_all: bool) -> dict[str, Any]:
  """Medians over kept rounds; paired ratios (per round, then the median)
  against the hand-written GPipe (wall and CPU) and against plain jit given
  both cores (wall)."""
  kept = [r for r in rounds if r["quiet"] or use_all]
  rows = {}
  for name, n in cases:
    key = f"{name}@{n}"
    walls = [r["times"][key]["wall_s"] for r in kept]
    cpus = [r["times"][key]["cpu_s"] for r in kept]
    rows[key] = {"step_ms": round(1e3 * float(np.median(walls)), 2),
                 "cpu_ms": round(1e3 * float(np.median(cpus)), 2)}
    for ref in ("hand_gpipe", "plain_2core"):
      other = f"{ref}@{n}"
      ratios = [r["times"][key]["wall_s"] / r["times"][other]["wall_s"]
                for r in kept if other in r["times"]]
      rows[key][f"vs_{ref}"] = (round(float(np.median(ratios)), 3)
                                if ratios else None)
    # The work ratio: CPU seconds per step against the hand GPipe's.
    other = f"hand_gpipe@{n}"
    ratios = [r["times"][key]["cpu_s"] / r["times"][other]["cpu_s"]
              for r in kept if other in r["times"]]
    rows[key]["cpu_vs_hand_gpipe"] = (round(float(np.median(ratios)), 3)
                                      if ratios else None)
  return {"rounds_kept": len(kept), "rounds_quiet": sum(r["quiet"]
                                                        for r in rounds),
          "kept_busy_rounds": use_all and len(kept) > sum(
              r["quiet"] for r in rounds), "rows": rows}


def markdown(built: list[dict], summary: dict[str, Any],
             ns: Sequence[int]) -> str:
  """The issue's table: one line per variant, N columns side by side."""
  by = {(b["variant"], b["n"]): b for b in built}
  rows = summary["rows"]
  names = sorted({b["variant"] for b in built}, key=VARIANTS.index)
  nss = "/".join(str(n) for n in ns)
  lines = [f"| variant | step ms N={nss} | x hand GPipe | x plain jit 2 cores"
           f" | CPU ms | CPU x hand GPipe | first call s (CPU s)"
           f" | compile s (CPU s) | XLA temp MB"
           f" | HLO kchars (without metadata) |",
           "|---|---|---|---|---|---|---|---|---|---|"]
  for v in names:
    def col(f: Callable[[int], Any]) -> str:
      return "/".join(str(f(n)) for n in ns)
    lines.append(
        f"| {v} | {col(lambda n: rows[f'{v}@{n}']['step_ms'])}"
        f" | {col(lambda n: rows[f'{v}@{n}']['vs_hand_gpipe'])}"
        f" | {col(lambda n: rows[f'{v}@{n}']['vs_plain_2core'])}"
        f" | {col(lambda n: rows[f'{v}@{n}']['cpu_ms'])}"
        f" | {col(lambda n: rows[f'{v}@{n}']['cpu_vs_hand_gpipe'])}"
        f" | {col(lambda n: by[(v, n)]['first_call_s'])}"
        f" ({col(lambda n: by[(v, n)]['first_call_cpu_s'])})"
        f" | {col(lambda n: by[(v, n)]['compile_s'])}"
        f" ({col(lambda n: by[(v, n)]['compile_cpu_s'])})"
        f" | {col(lambda n: round(by[(v, n)]['temp_bytes'] / 2**20, 1))}"
        f" | {col(lambda n: round(by[(v, n)]['hlo_chars'] / 1e3))}"
        f" ({col(lambda n: round(by[(v, n)]['hlo_chars_no_metadata'] / 1e3))})"
        f" |")
  lines.append(f"| MaxText pipeline | skipped: {MAXTEXT_SKIP} |||||||||")
  lines += ["", f"Parameter-sized instructions in the compiled HLO, N={ns[0]}"
            f" (add/copy/zero fill; loop: run every iteration on every"
            f" device; branches: only where the owning block runs):", "",
            "| variant | loop | loop branches | once | once branches |",
            "|---|---|---|---|---|"]
  for v in names:
    ops = by[(v, ns[0])]["param_ops"]
    cells = ["/".join(str(ops[w][op]) for op in ("add", "copy", "broadcast"))
             for w in ("loop", "loop_branches", "once", "once_branches")]
    lines.append(f"| {v} | " + " | ".join(cells) + " |")
  tj = [v for v in names if v.startswith("tj_")]
  if tj:
    lines += ["", "HLO kchars per segment kind (unrolled ticks / loop bodies /"
              " interpreted ramps / outside segments / untagged) and copies"
              " of each kernel body (``experiments.hlo_breakdown``):", "",
              "| variant | N | segments | kchars | kernel copies |",
              "|---|---|---|---|---|"]
    for v in tj:
      for n in ns:
        bd = by[(v, n)]["hlo_breakdown"]
        kc = "/".join(str(round(x)) for x in bd["kchars_by_segment"].values())
        copies = ", ".join(f"{k} {c:g}" for k, c in
                           bd["kernel_copies"].items())
        lines.append(f"| {v} | {n} | {bd['segments']} | {kc} | {copies} |")
  return "\n".join(lines)


def main(args: PeerArgs) -> int:
  if args.worker is not None:
    return worker(args)
  log = lambda s: print(s, flush=True)
  cores = sorted(os.sched_getaffinity(0))[:2]
  kinds = {"plain_1core": cores[:1], "plain_2core": cores, "pipe": cores}
  wanted = [k for k in kinds if k == "pipe" and any(
      not v.startswith("plain") for v in args.variants) or k in args.variants]
  procs = {}
  try:
    for k in wanted:  # one at a time: builds do not share the cores
      procs[k] = _start(k, kinds[k], args, log)
    cases = [(v, n) for v in args.variants for n in args.ns]
    rounds = _rounds(procs, cases, args, log)
  finally:
    for w in procs.values():
      w.close()
  built = [b for w in procs.values() for b in w.built]
  quiet = sum(r["quiet"] for r in rounds)
  summary = summarise(rounds, cases, use_all=quiet == 0)
  table = markdown(built, summary, args.ns)
  record = {"args": args._asdict(), "cores": cores,
            "maxtext": {"skipped": MAXTEXT_SKIP}, "built": built,
            "summary": summary, "rounds": rounds, "table": table,
            "load_average": os.getloadavg()}
  log(table)
  log(f"{quiet} of {len(rounds)} rounds quiet (others under"
      f" {args.quiet_cores} cores)" + ("; none quiet, so the medians are over"
                                       " all rounds" if not quiet else ""))
  if args.output:
    runs.write_record(args.output, record, table)
    log(f"results: {args.output}")
  return 0
