"""Kernels of the README GPT profiled with 1 and 2 compile threads, alternated.

  python -m experiments.auto_plan_cold_compile --rounds=3
  python -m experiments.auto_plan_cold_compile --rounds=5 --vary=ahead

``--vary=ahead`` compares instead ``compile_pool.AHEAD`` 1 and 4 (one
compile thread): each kernel lowered, compiled and timed in turn, against
batches of 4 lowered and compiled pipelined (the lowering of each
overlapping the compile of the one before) before the first is timed.

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
flags.DEFINE_enum("vary", "workers", ["workers", "ahead"],
                  "What the two variants differ in: compile_pool.WORKERS"
                  " (1, 2) or compile_pool.AHEAD (1, 4).")


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
      if f.vary == "workers":
        compile_pool.WORKERS = workers
      else:   # variant 2: AHEAD = 4 on one compile thread
        compile_pool.WORKERS, compile_pool.AHEAD = 1, 4 if workers == 2 else 1
      t0, c0 = time.perf_counter(), time.process_time()
      prof = measure.profile_kernels(built.kernels, built.graph, avals,
                                     device, memo={},
                                     part=built.partition)
      rows[workers].append((time.perf_counter() - t0,
                            time.process_time() - c0))
      seconds[workers].append(sum(k.seconds * 1e3
                                  for k in prof.kernels.values()))
  names = (("one_thread_s", "two_threads_s") if f.vary == "workers" else
           ("ahead_1_s", "ahead_4_s"))
  med = {w: (statistics.median(r[0] for r in rs),
             statistics.median(r[1] for r in rs)) for w, rs in rows.items()}
  print(json.dumps({
      "placement": f"{f.placement}({f.pipe})",
      "kernels": len(built.kernels.kernels),
      "load": os.getloadavg()[0],
      "vary": f.vary,
      names[0]: {"wall": round(med[1][0], 2), "cpu": round(med[1][1], 2)},
      names[1]: {"wall": round(med[2][0], 2), "cpu": round(med[2][1], 2)},
      "paired_wall_ratio": [round(b[0] / a[0], 3)
                            for a, b in zip(rows[1], rows[2])],
      "paired_cpu_ratio": [round(b[1] / a[1], 3)
                           for a, b in zip(rows[1], rows[2])],
      "kernels_ms_per_round": {w: [round(s, 3) for s in v]
                               for w, v in seconds.items()},
  }), flush=True)


if __name__ == "__main__":
  cli.run(main)
