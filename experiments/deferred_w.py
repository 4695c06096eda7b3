"""Device 1's ResNet18 backward, weight gradients per micro-batch or deferred.

  taskset -c 0,1 python -m experiments.deferred_w --rounds=9

One single-threaded CPU device runs each program of
``experiments.deferred_w_lib.programs`` (device 1's part of the placed
ResNet18 step: per micro-batch weight gradients added into accumulators,
as the lowering does, against a deferred, batched weight gradient); they
are checked equal (gradients and input cotangents) and timed interleaved
in shuffled order: wall and process CPU ms, minor page faults, paired
ratios against ``per_mb``; with ``--parts``, so are the pieces of their
work (``deferred_w_lib.parts``: without the adds, without any weight
gradient, the forward per micro-batch and batched, the batched gradient). The deferred forms are not in the lowering:
this measures what they would save on that device's kernels.
"""

import json
import os
import statistics

from absl import flags

from experiments import cli, rel_err, xla_env

flags.DEFINE_integer("n", 8, "Micro-batches.")
flags.DEFINE_integer("rows", 4, "Rows per micro-batch.")
flags.DEFINE_integer("rounds", 9, "Timed rounds (each variant once each).")
flags.DEFINE_bool("parts", True,
                  "Also time the pieces of their work (deferred_w_lib.PARTS)"
                  " in the same rounds.")
flags.DEFINE_string("output", "out/deferred_w.json",
                    "Where to write the JSON results ('': stdout only).")


def main(argv):
  cli.no_arguments(argv)
  f = flags.FLAGS
  cli.check_created(f.output, "--output", suffixes=(".json",))
  xla_env.add_xla_flags(xla_env.cpu_flags(1, single_thread=True))
  from experiments import deferred_w_lib as lib  # pylint: disable=import-outside-toplevel
  from experiments import placed_bench as pb  # pylint: disable=import-outside-toplevel
  args = lib.inputs(f.n, f.rows)
  runs = {k: (lambda g=g: g(*args))
          for k, g in lib.programs(f.n, f.rows).items()}
  ref = lib.VARIANTS[0]
  want = runs[ref]()
  for k, run in runs.items():
    err = rel_err.max_rel(run(), want)
    if err > 1e-4:
      raise AssertionError(f"{k}: rel. error {err} against {ref}")
  if f.parts:
    runs.update({k: (lambda g=g: g(*args))
                 for k, g in lib.parts(f.n, f.rows).items()})
  times, loads = pb.shuffled_rounds(runs, f.rounds)
  rows = {}
  for k, ts in times.items():
    pairs = list(zip(ts, times[ref]))
    rows[k] = {"wall_ms": round(1e3 * statistics.median_high([t[0] for t in ts]), 1),
               "cpu_ms": round(1e3 * statistics.median_high([t[1] for t in ts]), 1),
               "faults": statistics.median_high([t[3] for t in ts]),
               "paired_wall": round(statistics.median_high([a[0] / b[0] for a, b in pairs]), 3),
               "paired_cpu": round(statistics.median_high([a[1] / b[1] for a, b in pairs]), 3)}
    print(json.dumps({k: rows[k]}), flush=True)
  out = {"n": f.n, "rows": f.rows, "rounds": f.rounds, "variants": rows,
         "load_average": [round(min(loads), 1), round(max(loads), 1)]}
  if f.output:
    os.makedirs(os.path.dirname(f.output) or ".", exist_ok=True)
    with open(f.output, "w") as fh:
      json.dump(out, fh, indent=1)


if __name__ == "__main__":
  cli.run(main)
