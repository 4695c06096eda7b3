"""Where the CPU of a 4-stage ``peer_bench`` step goes, by code (Linux perf).

Usage (needs ``perf``; 4 fake devices pinned to 2 cores)::

  python -m experiments.peer_bench_perf --steps=5
  python -m experiments.peer_bench_perf --variants=tj_mshape,tj_gpipe

One worker process per variant (``peer_bench``'s 8 layers of width 1024,
256 rows per micro-batch, N = 8) builds it, warms it, then samples its own
process with ``perf record`` over ``--steps`` steps and reads the process
CPU seconds around them. The samples are charged to kinds of code by
symbol and library (:func:`category`): XLA's dot kernels (``ynn`` dots,
Eigen's GEMM), the dots' operand transposes, XLA's compiled fusions (JIT
code: elementwise work, stash and accumulator updates, copies), libc
copies and fills, the kernel's page faults (fresh temp buffers touched)
and scheduling (rendezvous sleeps and wake-ups), and XLA's runtime. The
table gives CPU ms per step in each (the share of samples times the
measured CPU). Unlike ``mshape_profile`` (thunk wall times, inflated when
4 device threads share 2 cores) these are CPU figures, as the work ratio
is.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

from absl import app, flags

from experiments import cli, xla_env
from experiments.peer_bench_perf_lib import markdown, worker

flags.DEFINE_list("variants", ["hand_gpipe", "tj_gpipe", "tj_mshape",
                               "tj_zbv"], "peer_bench variants (4 stages).")
flags.DEFINE_integer("steps", 5, "Sampled steps per variant.")
flags.DEFINE_integer("n", 8, "Micro-batches per step.")
flags.DEFINE_string("output", "", "JSON results ('': print only).")
flags.DEFINE_integer("top", 0, "Also list each variant's hottest symbols"
                     " (CPU ms per step).")
flags.DEFINE_string("worker", None, "Internal: sample this one variant.")


def main(argv: list[str]) -> None:
  """Worker: one variant; parent: a pinned worker per variant, the table."""
  cli.no_arguments(argv)
  f = flags.FLAGS
  if f.worker:
    xla_env.add_xla_flags(xla_env.cpu_flags(4))
    print(json.dumps({"perf": worker(f.worker, f.steps, f.n, f.top)}), flush=True)
    return
  if not shutil.which("perf"):
    raise app.UsageError("peer_bench_perf needs Linux perf on the PATH")
  cores = sorted(os.sched_getaffinity(0))[:2]
  rows = []
  for name in f.variants:
    cmd = [sys.executable, "-m", "experiments.peer_bench_perf",
           f"--worker={name}", f"--steps={f.steps}", f"--n={f.n}",
           f"--top={f.top}"]
    if shutil.which("taskset"):
      cmd = ["taskset", "-c", ",".join(map(str, cores))] + cmd
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
    out = subprocess.run(cmd, capture_output=True, text=True, env=env,
                         check=True).stdout
    rows += [json.loads(l)["perf"] for l in out.splitlines()
             if l.startswith('{"perf"')]
    print(json.dumps({k: v for k, v in rows[-1].items() if k != "top"}),
          flush=True)
    for cat, sym, ms in rows[-1]["top"]:
      print(f"  {name:10s} {ms:7.1f} ms  {cat:16s} {sym}", flush=True)
  print(markdown(rows))
  print("load", os.getloadavg())
  if f.output:
    with open(f.output, "w", encoding="utf-8") as fh:
      json.dump(rows, fh, indent=1)


if __name__ == "__main__":
  cli.run(main)
