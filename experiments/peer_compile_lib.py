"""Paired compile times of ``peer_bench``'s programs (``experiments.peer_compile``).

One worker process per code version (this tree, or another tree's
``tessel_jax`` and ``passes`` put first on the path) builds each variant of
``experiments.peer_bench`` once (for tessel_jax: trace, cost, search) and
compiles it once to warm XLA up; it then answers ``time compile VARIANT N``
with the wall and process CPU seconds of one fresh
``jax.jit(...).lower(...).compile()`` (lowering untimed, no compile cache
answers: each lowering is a new program object). The parent asks every
(version, variant, N) once per round, in a shuffled order, so the hand
GPipe and tessel_jax's program are compiled side by side in the same
minutes of a loaded machine; the ratio of a round (tessel_jax / hand, or
version / base version) is paired, and its median over rounds is what to
read. Compile runs on one thread, so its CPU seconds barely move with the
load, unlike its wall time. Each program's HLO is split by kind
(``experiments.hlo_parts``) in a second table.
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

from experiments import hlo_parts, workers


class CompileArgs(NamedTuple):
  """Options of ``experiments.peer_compile`` (see its flags)."""
  variants: tuple[str, ...] = ("hand_gpipe", "tj_compact")
  ns: tuple[int, ...] = (8, 32)
  rounds: int = 7
  # (label, checkout[, python]) as ``cli.Version``; '': this tree / interpreter.
  versions: tuple[tuple[str, ...], ...] = (("this", ""),)
  hidden: int = 1024
  rows: int = 256
  seed: int = 0
  output: str | None = "results/peer_bench/peer_compile.json"


# --- the worker ----------------------------------------------------------------


def _peer_args(args: CompileArgs, n: int) -> Any:
  from experiments import peer_bench_lib  # pylint: disable=import-outside-toplevel
  return peer_bench_lib.PeerArgs(hidden=args.hidden, rows=args.rows, ns=(n,),
                                 seed=args.seed, variants=args.variants)


def _program(name: str, n: int, args: CompileArgs) -> tuple[Callable, tuple]:
  """``(fn, inputs)``: the function whose fresh jit is lowered and compiled
  (tessel_jax's variants built once: trace, cost, search)."""
  import jax  # pylint: disable=import-outside-toplevel

  from experiments import peer_bench_lib  # pylint: disable=import-outside-toplevel
  make, inputs = peer_bench_lib._variant_fns(  # pylint: disable=protected-access
      name, n, _peer_args(args, n))
  f = make()
  jitted = f.build(*inputs).jitted if name.startswith("tj_") else f
  jax.block_until_ready(jitted(*inputs))
  return jitted.__wrapped__, inputs


def compile_once(fn: Callable, inputs: tuple, text: bool = False
                 ) -> dict[str, Any]:
  """Lowers a fresh jit of ``fn`` and compiles it: the compile's wall and
  process CPU seconds (``wall_s``, ``cpu_s``), the lowering's wall, and the
  compiled HLO's size (and ``text`` itself if asked)."""
  import jax  # pylint: disable=import-outside-toplevel
  t0 = time.perf_counter()
  lowered = jax.jit(lambda *a: fn(*a)).lower(*inputs)
  lower_s = time.perf_counter() - t0
  c0, t0 = workers.cpu_s(), time.perf_counter()
  compiled = lowered.compile()
  wall, cpu = time.perf_counter() - t0, workers.cpu_s() - c0
  hlo = compiled.as_text()
  return {"wall_s": wall, "cpu_s": cpu, "lower_s": round(lower_s, 3),
          "hlo_chars": len(hlo), **({"text": hlo} if text else {})}


def worker(args: CompileArgs) -> int:
  """Builds every (variant, N), compiles each once, then serves
  ``time compile VARIANT N`` lines (``quit`` ends)."""
  progs = {}
  for name in args.variants:
    for n in args.ns:
      progs[(name, n)] = _program(name, n, args)
      text = compile_once(*progs[(name, n)], text=True)["text"]
      print(json.dumps({"built": {"variant": name, "n": n,
                                  "hlo": hlo_parts.summary(text)}}),
            flush=True)
  import tessel_jax  # pylint: disable=import-outside-toplevel
  print(json.dumps({"ready": True, "tessel_jax": os.path.dirname(
      tessel_jax.__file__)}), flush=True)
  for line in sys.stdin:
    cmd = line.split()
    if not cmd or cmd[0] == "quit":
      break
    name, n = cmd[2], int(cmd[3])
    print(json.dumps(compile_once(*progs[(name, n)])), flush=True)
  return 0


# --- the parent ------------------------------------------------------------------


def version_path(path: str, tmp: str) -> str:
  """A folder to put first on ``PYTHONPATH`` so that ``tessel_jax`` and
  ``tessel_jax.passes`` come from the tree at ``path`` ('' : this tree, no
  folder needed); the runners (``experiments``) stay this tree's."""
  if not path:
    return ""
  root = os.path.abspath(path)
  pkg = os.path.join(tmp, os.path.basename(root) or "version", "tessel_jax")
  os.makedirs(pkg)
  src = os.path.join(root, "tessel_jax")
  for entry in os.listdir(src):
    os.symlink(os.path.join(src, entry), os.path.join(pkg, entry))
  os.symlink(os.path.join(root, "passes"), os.path.join(pkg, "passes"))
  return os.path.dirname(pkg)


def _start(label: str, path: str, tmp: str, args: CompileArgs,
           cores: Sequence[int], log: Callable[[str], None],
           python: str = "") -> workers.Worker:
  cmd = [python or sys.executable, "-m", "experiments.peer_compile", "--worker",
         f"--variants={','.join(args.variants)}",
         f"--ns={','.join(map(str, args.ns))}", f"--hidden={args.hidden}",
         f"--rows={args.rows}", f"--seed={args.seed}", "--output="]
  env = dict(os.environ)
  env.pop("XLA_FLAGS", None)
  env.pop("PEER_COMPILE_TREE", None)
  first = version_path(path, tmp)
  if first:  # read by the worker's binary before it imports tessel_jax
    env["PEER_COMPILE_TREE"] = first
  w = workers.Worker(f"peer_compile worker {label}", cmd, cores, env, log)
  log(f"worker {label}: tessel_jax from {w.ready['tessel_jax']}")
  return w


def summarise(rounds: list[dict], args: CompileArgs) -> dict[str, Any]:
  """Medians per case and paired ratios per round (tessel_jax variants
  over ``hand_gpipe``; each version over the first)."""
  labels = [v[0] for v in args.versions]
  med = lambda xs: round(statistics.median(xs), 4) if xs else None
  out: dict[str, Any] = {"cases": {}, "x_hand": {}, "x_base": {}}
  for label in labels:
    for name in args.variants:
      for n in args.ns:
        key = f"{label} {name} {n}"
        rows = [r["times"][key] for r in rounds]
        out["cases"][key] = {"compile_cpu_s": med([x["cpu_s"] for x in rows]),
                             "compile_wall_s": med([x["wall_s"] for x in rows]),
                             "hlo_chars": rows[0]["hlo_chars"]}
        if name != "hand_gpipe" and "hand_gpipe" in args.variants:
          hand = f"{label} hand_gpipe {n}"
          out["x_hand"][key] = {
              m: med([r["times"][key][f] / r["times"][hand][f]
                      for r in rounds]) for m, f in (("cpu", "cpu_s"),
                                                     ("wall", "wall_s"))}
        if label != labels[0]:
          base = f"{labels[0]} {name} {n}"
          out["x_base"][key] = {
              m: med([r["times"][key][f] / r["times"][base][f]
                      for r in rounds]) for m, f in (("cpu", "cpu_s"),
                                                     ("wall", "wall_s"))}
  return out


def markdown(summary: dict[str, Any]) -> str:
  """The summary as a Markdown table."""
  lines = ["| version variant N | compile CPU s | wall s | HLO kchars"
           " | CPU x hand (paired) | wall x hand | CPU x base |",
           "|---|---|---|---|---|---|---|"]
  for key, c in summary["cases"].items():
    xh = summary["x_hand"].get(key, {})
    xb = summary["x_base"].get(key, {})
    lines.append(f"| {key} | {c['compile_cpu_s']} | {c['compile_wall_s']}"
                 f" | {c['hlo_chars'] / 1000:.1f} | {xh.get('cpu', '')}"
                 f" | {xh.get('wall', '')} | {xb.get('cpu', '')} |")
  return "\n".join(lines)


def main(args: CompileArgs) -> int:
  """Starts one worker per version, runs the rounds, writes the record."""
  from experiments import runs  # pylint: disable=import-outside-toplevel
  log = lambda s: print(s, flush=True)
  cores = sorted(os.sched_getaffinity(0))[:2]
  rng = random.Random(args.seed)
  procs: dict[str, workers.Worker] = {}
  rounds = []
  with tempfile.TemporaryDirectory() as tmp:
    try:
      for label, path, *python in args.versions:
        procs[label] = _start(label, path, tmp, args, cores, log, *python)
      cases = [(v[0], name, n) for v in args.versions
               for name in args.variants for n in args.ns]
      for r in range(args.rounds):
        order = list(cases)
        rng.shuffle(order)
        times = {f"{l} {v} {n}": procs[l].time("compile", v, n)
                 for l, v, n in order}
        rounds.append({"round": r, "load_average": os.getloadavg()[0],
                       "times": times})
        log(f"round {r}: load {os.getloadavg()[0]:.1f}")
    finally:
      for w in procs.values():
        w.close()
  summary = summarise(rounds, args)
  built = {f"{l} {b['variant']} {b['n']}": b["hlo"]
           for l, w in procs.items() for b in w.built}
  table = markdown(summary) + "\n\n" + hlo_parts.parts_table(built)
  log(table)
  loads = [r["load_average"] for r in rounds]
  log(f"load average {min(loads):.1f}-{max(loads):.1f} over"
      f" {len(rounds)} rounds")
  if args.output:
    runs.write_record(args.output, {"args": args._asdict(),
                                    "summary": summary, "rounds": rounds,
                                    "hlo": built, "table": table}, table)
  return 0
