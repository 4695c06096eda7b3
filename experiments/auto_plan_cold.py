"""One cold ``placement="auto"`` choice on the README GPT, in this process.

  python -m experiments.auto_plan_cold --cost=measured
  python -m experiments.auto_plan_cold --cost=calibrated --memory_limit=6MiB

Builds ``tj.schedule(fn, placement="auto", num_microbatches=8, ...)`` on a
fresh measurement and schedule cache (4 fake CPU devices; vshape,
interleaved, mshape, mllm, zbv; CP-SAT 5 s; 2 optimizer slots) and prints
one JSON line: wall and process CPU seconds of the choice, load average,
the plan chosen and its prediction. Run it once per process, alternating
the code versions compared (a second choice in one process reuses the
priced plans).
"""

import json
import os
import sys
import tempfile
import time

from absl import app, flags

from experiments import cli

flags.DEFINE_enum("cost", "measured", ["measured", "calibrated"],
                  "tj.schedule cost= option.")
flags.DEFINE_string("memory_limit", "none",
                    "Bytes per device: none, 6MiB, 512KiB, 123 ...")
flags.DEFINE_list("placements", ["vshape", "interleaved", "mshape", "mllm",
                                 "zbv"], "Placements tried.")


def main(argv: list[str]) -> None:
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {argv[1:]}")
  f = flags.FLAGS
  from experiments import xla_env  # pylint: disable=import-outside-toplevel
  xla_env.add_xla_flags(xla_env.cpu_flags(4))
  import jax  # pylint: disable=import-outside-toplevel
  import tessel_jax as tj  # pylint: disable=import-outside-toplevel
  from experiments import auto_plan_lib as apl  # pylint: disable=import-outside-toplevel
  from tessel_jax import plans  # pylint: disable=import-outside-toplevel
  args = apl.AutoPlanArgs(placements=tuple(f.placements), time_limit=5)
  fn, params, batch, has_aux = apl.program(args)
  plans.DEFAULT_PLACEMENTS = args.placements
  step = tj.schedule(fn, mesh=jax.make_mesh((4,), ("pipe",)),
                     placement="auto", num_microbatches=args.microbatches,
                     memory_limit=apl.parse_limit(f.memory_limit),
                     cache_dir=tempfile.mkdtemp(prefix="auto_plan_cold_"),
                     solver_time_limit_s=args.time_limit, cost=f.cost,
                     optimizer_slots=2, has_aux=has_aux)
  load0 = os.getloadavg()[0]
  t0, c0 = time.perf_counter(), time.process_time()
  step.build(params, batch)
  wall, cpu = time.perf_counter() - t0, time.process_time() - c0
  print(json.dumps({
      "cost": f.cost, "memory_limit": f.memory_limit, "wall_s": round(wall, 2),
      "cpu_s": round(cpu, 2), "load": [load0, os.getloadavg()[0]],
      "chose": step.choice.winner.label,
      "predicted_ms": round(step.choice.winner.step, 3),
      "plans": len(step.choice.frontier.plans)}), flush=True)
  sys.exit(0)


if __name__ == "__main__":
  cli.run(main)
