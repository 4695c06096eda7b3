"""What one device's per-step prologue costs the placed ResNet18 step.

  taskset -c 0,1 python -m experiments.prologue_cost --rounds=21

``resnet18_auto`` on ``vshape(2)`` (``experiments.resnet_ab``'s ``base``),
built four times: ``base``; ``ctl``, every fill of 1 MiB or more under a
``lax.cond`` on the device index (plain fill both ways); ``x0`` / ``x1``,
those fills written ``--passes`` times on device 0 / 1 only
(``experiments.prologue_cost_lib.extra_passes``; exactly zero, gradients
checked against ``base``). Timed once per round in shuffled order (wall and
process CPU, load average); paired ratios against ``ctl``. A ratio near 1
says that device's prologue is off the critical path (work removed there
would not shorten the step); the extra MB per pass are printed beside it,
with each device's idle slot bytes (``idle_slot_bytes``: slot arrays it
fills and outputs without holding a leaf).
"""

import json
import os
import statistics

from absl import flags

from experiments import cli, rel_err, xla_env

flags.DEFINE_integer("rounds", 21, "Timed rounds (each variant once each).")
flags.DEFINE_integer("passes", 3, "Writes of each big fill on the device.")
flags.DEFINE_integer("min_bytes", 1 << 20, "Fills from this size change.")
flags.DEFINE_string("output", "out/prologue_cost.json",
                    "Where to write the JSON results ('': stdout only).")

VARIANTS = {"base": None, "ctl": -1, "x0": 0, "x1": 1}


def main(argv):
  cli.no_arguments(argv)
  f = flags.FLAGS
  cli.check_created(f.output, "--output", suffixes=(".json",))
  cli.at_least(1, "passes")
  xla_env.add_xla_flags(xla_env.cpu_flags(2, single_thread=True))
  from experiments import placed_bench as pb  # pylint: disable=import-outside-toplevel
  from experiments import prologue_cost_lib as lib  # pylint: disable=import-outside-toplevel
  from experiments.resnet_variants import build  # pylint: disable=import-outside-toplevel
  fn, params, batch = pb.model("resnet18_auto", 8)
  built = {}
  for v, dev in VARIANTS.items():
    with lib.extra_passes(dev, f.passes, f.min_bytes):
      run, step, _ = build("base", fn, params, batch, 8)
      grads = step.unplace(run()[1])  # lowered and compiled here
    built[v] = (run, step, grads)
  for v, (_, _, grads) in built.items():
    err = rel_err.max_rel(grads, built["base"][2])
    if err > 1e-5:
      raise AssertionError(f"{v}: gradient rel. error {err} against base")
  times, loads = pb.shuffled_rounds({v: b[0] for v, b in built.items()},
                                    f.rounds)
  layout = built["base"][1].built.layout
  out = {"rounds": f.rounds, "passes": f.passes, "min_bytes": f.min_bytes,
         "idle_slot_mb": [round(b / 1e6, 2)
                          for b in lib.idle_slot_bytes(layout)],
         "load_average": [round(min(loads), 1), round(max(loads), 1)],
         "variants": {v: _row(ts, times["ctl"]) for v, ts in times.items()}}
  print(json.dumps(out, indent=1), flush=True)
  if f.output:
    os.makedirs(os.path.dirname(f.output) or ".", exist_ok=True)
    with open(f.output, "w") as fh:
      json.dump(out, fh, indent=1)


def _row(ts, ref):
  """Medians of one variant's rounds and its paired ratios to ``ref``."""
  med = statistics.median_high
  return {"wall_ms": round(1e3 * med([t[0] for t in ts]), 1),
          "cpu_ms": round(1e3 * med([t[1] for t in ts]), 1),
          "paired_wall": round(med([a[0] / b[0] for a, b in zip(ts, ref)]), 3),
          "paired_cpu": round(med([a[1] / b[1] for a, b in zip(ts, ref)]), 3)}


if __name__ == "__main__":
  cli.run(main)
