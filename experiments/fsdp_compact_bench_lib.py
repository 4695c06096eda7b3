"""The work of ``experiments.fsdp_compact_bench`` (its flags are defined and
documented there; its ``main`` imports this module, so that
``--help`` imports no jax, CP-SAT or matplotlib). Reads the
flags it is given (``absl.flags.FLAGS``)."""

import json
import os
import sys
import time
from typing import Any

import jax
import numpy as np
from absl import app, flags

from experiments import cli
from experiments import tp_bench_lib as tb




def _timed(runs: dict, rounds: int) -> dict:
  """Per variant, wall and CPU seconds of each round (shuffled order)."""
  rng = np.random.default_rng(0)
  for fn in runs.values():
    jax.block_until_ready(fn())
  out = {n: {"wall": [], "cpu": []} for n in runs}
  for _ in range(rounds):
    for n in rng.permutation(list(runs)):
      c0, t0 = time.process_time(), time.perf_counter()
      jax.block_until_ready(runs[n]())
      out[n]["wall"].append(time.perf_counter() - t0)
      out[n]["cpu"].append(time.process_time() - c0)
  return out


def _variants(ramps: list[int], modes: list[str]) -> list[tuple[int, Any]]:
  """``(interpret_ramps, fsdp or None)`` per variant, the first the
  reference of the ratios."""
  return [(r, m) for r in ramps for m in (modes or [None])]


def _key(name: str, ramps: int, mode: str | None) -> str:
  return f"{name}@{ramps}" + (f"/{mode}" if mode else "")


def _row(rec: dict, t: dict, first: dict) -> dict:
  """One variant's JSON row: its record ``rec``, its times ``t`` and
  ratios to the config's first variant's times ``first``."""
  return {"plan": rec["plan"], "lowering": rec["lowering"],
          "err": rec["max_rel_err_vs_value_and_grad"],
          "wall_ms": 1e3 * float(np.median(t["wall"])),
          "cpu_ms": 1e3 * float(np.median(t["cpu"])),
          "wall_ratio": float(np.median(np.divide(t["wall"], first["wall"]))),
          "cpu_ratio": float(np.median(np.divide(t["cpu"], first["cpu"]))),
          "compile_s": rec["compile_s"],
          "mib": rec["total_bytes_per_device"] / 2**20,
          "predicted_mib": rec["predicted_bytes_per_device"] / 2**20}


def run(configs: list[str], ramps: list[int], repeats: int,
        microbatches: int = 4, modes: list[str] | None = None) -> dict:
  """Builds, checks and times every (config, lowering, FSDP mode);
  returns the record (also printed)."""
  base = tb.BenchArgs(cost="uniform", microbatches=microbatches)
  model, batch = tb.gpt(base), tb.make_batch(base)
  reference = jax.jit(jax.value_and_grad(model[2](1)))(model[0], batch)
  variants = _variants(ramps, list(modes or []))
  recs, runs = {}, {}
  for name in configs:
    for r, m in variants:
      key = _key(name, r, m)
      recs[key], runs[key] = tb.measure(
          name, base._replace(interpret_ramps=r, fsdp=m), model, batch,
          reference)
  load0 = os.getloadavg()[0]
  times = _timed(runs, repeats)
  record = {"load_average": [load0, os.getloadavg()[0]],
            "microbatches": microbatches, "repeats": repeats, "rows": {}}
  for name in configs:
    first = times[_key(name, *variants[0])]
    for r, m in variants:
      key = _key(name, r, m)
      row = record["rows"][key] = _row(recs[key], times[key], first)
      print(f"{key:36s}: wall {row['wall_ms']:7.2f} ms"
            f" CPU {row['cpu_ms']:7.2f} ms, x {_key(name, *variants[0])}:"
            f" wall {row['wall_ratio']:.3f} CPU {row['cpu_ratio']:.3f};"
            f" {row['mib']:6.2f} MiB (predicted {row['predicted_mib']:6.2f},"
            f" {row['predicted_mib'] / row['mib']:.2f}x); compile"
            f" {row['compile_s']:.1f} s; err {row['err']:.1e};"
            f" {row['plan']}; {row['lowering']}", flush=True)
  print(f"load average {record['load_average'][0]:.1f} ->"
        f" {record['load_average'][1]:.1f}")
  return record


def main(argv: list[str]) -> None:
  cli.no_arguments(argv)
  f = flags.FLAGS
  bad = [c for c in f.configs if c not in tb.CONFIGS or
         not tb.CONFIGS[c][1]]
  if bad:
    raise app.UsageError(f"--configs: {bad} are not pipelined tp_bench"
                         f" configs; use some of {f['configs'].default}")
  os.environ["XLA_FLAGS"] = " ".join(
      x for x in [os.environ.get("XLA_FLAGS", ""),
                  "--xla_force_host_platform_device_count=8"] if x)
  os.environ.setdefault("JAX_PLATFORMS", "cpu")
  record = run(list(f.configs), [int(r) for r in f.interpret_ramps],
               f.repeats, f.microbatches, list(f.fsdp))
  if f.output:
    os.makedirs(os.path.dirname(f.output) or ".", exist_ok=True)
    with open(f.output, "w", encoding="utf-8") as fh:
      json.dump(record, fh, indent=1)
  sys.exit(0)
