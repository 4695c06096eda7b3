"""The placed ResNet18 ``train_step`` (fused step + sgd update), paired.

  taskset -c 0,1 python -m experiments.train_step_ab --rounds=7

The model, mesh and plan of ``experiments.resnet_ab`` (``vshape(2)``, N = 8,
``param_layout="auto"``); each variant of ``resnet_ab.VARIANTS`` trains
with ``step.train_step(optax.sgd)`` from the same parameters, its losses
checked equal to the first variant's; then every variant takes one step
per round in shuffled order (wall, process CPU and system CPU ms, minor
page faults). Paired ratios are against the first variant.
"""

import json
import os
import random

from absl import flags

from experiments import cli, resnet_variants, xla_env

flags.DEFINE_list("variants", ["base", "workspace"],
                  "Variants of experiments.resnet_variants.VARIANTS, the first"
                  " the reference.")
flags.DEFINE_integer("rounds", 7, "Timed rounds (each variant once each).")
flags.DEFINE_string("output", "out/train_step_ab.json",
                    "Where to write the JSON results ('': stdout only).")


def _med(xs):
  return sorted(xs)[len(xs) // 2]


def _trainer(name, fn, params, batch, n, opt):
  """A closure taking one ``train_step`` of variant ``name``."""
  _, step, _ = resnet_variants.build(name, fn, params, batch, n)
  state = {"p": step.place(params, batch)}
  state["o"] = opt.init(state["p"])
  train = step.train_step(opt)

  def run():
    value, state["p"], state["o"] = train(state["p"], state["o"], batch)
    return value
  return run


def main(argv):
  cli.no_arguments(argv)
  f = flags.FLAGS
  cli.check_created(f.output, "--output", suffixes=(".json",))
  xla_env.add_xla_flags(xla_env.cpu_flags(2, single_thread=True))
  import optax  # pylint: disable=import-outside-toplevel
  from experiments import placed_bench as pb  # pylint: disable=import-outside-toplevel
  bad = [v for v in f.variants if v not in resnet_variants.VARIANTS]
  if bad or not f.variants:
    raise ValueError(f"unknown --variants {bad}; choose from"
                     f" {sorted(resnet_variants.VARIANTS)}")
  n = 8
  fn, params, batch = pb.model("resnet18_auto", n)
  opt = optax.sgd(1e-3)
  runs = {v: _trainer(v, fn, params, batch, n, opt) for v in f.variants}
  ref = f.variants[0]
  losses = {v: [float(run()) for _ in range(2)] for v, run in runs.items()}
  for v, ls in losses.items():
    for a, b in zip(ls, losses[ref]):
      if abs(a - b) > 1e-5 * abs(b):
        raise AssertionError(f"{v}: loss {a} != {ref}'s {b}")
  times = {v: [] for v in runs}
  loads = []
  for _ in range(f.rounds):
    for v in random.sample(list(runs), len(runs)):
      times[v].append(pb._timed(runs[v]))  # pylint: disable=protected-access
    loads.append(os.getloadavg()[0])
  rows = {}
  for v, ts in times.items():
    pairs = list(zip(ts, times[ref]))
    rows[v] = {"wall_ms": round(1e3 * _med([t[0] for t in ts]), 1),
               "cpu_ms": round(1e3 * _med([t[1] for t in ts]), 1),
               "sys_ms": round(1e3 * _med([t[2] for t in ts]), 1),
               "faults": _med([t[3] for t in ts]),
               "paired_wall": round(_med([a[0] / b[0] for a, b in pairs]), 3),
               "paired_cpu": round(_med([a[1] / b[1] for a, b in pairs]), 3)}
    print(json.dumps({v: rows[v]}), flush=True)
  out = {"rounds": f.rounds, "variants": rows,
         "load_average": [round(min(loads), 1), round(max(loads), 1)]}
  print(f"load {out['load_average']}", flush=True)
  if f.output:
    os.makedirs(os.path.dirname(f.output) or ".", exist_ok=True)
    with open(f.output, "w") as fh:
      json.dump(out, fh, indent=1)


if __name__ == "__main__":
  cli.run(main)
