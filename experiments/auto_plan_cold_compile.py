"""Kernels of the README GPT profiled with 1 and 2 compile threads, alternated.

  python -m experiments.auto_plan_cold_compile --rounds=3

A cold ``placement="auto"`` choice compiles and times every kernel of the
plans it builds in full (``cost.measure.profile_kernels``). With
``cost.compile_pool.WORKERS = 2`` the next kernel to measure is compiled
beside the current one (XLA compiles outside the GIL); each is still timed
alone. This runner cuts the README GPT for one plan (``--placement``, 4
fake CPU devices, N = 8, ``cost="uniform"``: nothing measured), then
profiles its kernels from scratch (no disk cache, empty memo) once per
variant and round, the variants alternated in a shuffled order, and prints
one JSON line: wall and process CPU seconds per variant (medians), the
paired wall ratio two / one thread per round, the load average, and the
sum of the kernel milliseconds each variant measured per round (they should
agree: the timing is unchanged).
"""

import json
import os
import random
import statistics
import time

from absl import app, flags

from experiments import cli

flags.DEFINE_integer("rounds", 3, "Rounds (each profiles once per variant).")
flags.DEFINE_string("placement", "vshape", "Placement of the plan cut.")
flags.DEFINE_integer("pipe", 4, "Devices per pipeline.")


def main(argv: list[str]) -> None:
  cli.no_arguments(argv)
  f = flags.FLAGS
  if f.rounds < 1:
    raise app.UsageError(f"--rounds must be >= 1, got {f.rounds}")
  from experiments import xla_env  # pylint: disable=import-outside-toplevel
  xla_env.add_xla_flags(xla_env.cpu_flags(4))
  import jax  # pylint: disable=import-outside-toplevel
  import tessel_jax as tj  # pylint: disable=import-outside-toplevel
  from experiments import auto_plan_lib as apl  # pylint: disable=import-outside-toplevel
  from tessel_jax import placements  # pylint: disable=import-outside-toplevel
  from tessel_jax.cost import call_timing, compile_pool, measure  # pylint: disable=import-outside-toplevel
  args = apl.AutoPlanArgs()
  fn, params, batch, _ = apl.program(args)
  mesh = jax.make_mesh((f.pipe,), ("pipe",),
                       devices=jax.devices()[:f.pipe])
  step = tj.schedule(fn, mesh=mesh, placement=placements.get(
      f.placement, f.pipe), num_microbatches=args.microbatches,
                     cost="uniform", cut="auto")
  built = step.build(params, batch)
  avals = built.partition.traced.param_avals
  device = jax.devices()[0]
  call_timing.call_overhead(device, cores=1)   # once per process, not timed
  rows: dict[int, list[tuple[float, float]]] = {1: [], 2: []}
  seconds: dict[int, list[float]] = {1: [], 2: []}
  rng = random.Random(0)
  for _ in range(f.rounds):
    order = [1, 2]
    rng.shuffle(order)
    for workers in order:
      compile_pool.WORKERS = workers
      t0, c0 = time.perf_counter(), time.process_time()
      prof = measure.profile_kernels(built.kernels, built.graph, avals,
                                     device, memo={},
                                     part=built.partition)
      rows[workers].append((time.perf_counter() - t0,
                            time.process_time() - c0))
      seconds[workers].append(sum(k.seconds * 1e3
                                  for k in prof.kernels.values()))
  med = {w: (statistics.median(r[0] for r in rs),
             statistics.median(r[1] for r in rs)) for w, rs in rows.items()}
  print(json.dumps({
      "placement": f"{f.placement}({f.pipe})",
      "kernels": len(built.kernels.kernels),
      "load": os.getloadavg()[0],
      "one_thread_s": {"wall": round(med[1][0], 2),
                       "cpu": round(med[1][1], 2)},
      "two_threads_s": {"wall": round(med[2][0], 2),
                        "cpu": round(med[2][1], 2)},
      "paired_wall_ratio": [round(b[0] / a[0], 3)
                            for a, b in zip(rows[1], rows[2])],
      "kernels_ms_per_round": {w: [round(s, 3) for s in v]
                               for w, v in seconds.items()},
  }), flush=True)


if __name__ == "__main__":
  cli.run(main)
