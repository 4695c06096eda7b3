"""Compacted ticks (``passes.tick_order``) against the default, paired.

  python -m experiments.tick_order_bench --model=mlp --n=8 --rounds=9

One process, 2 fake single-threaded CPU devices (pin it to 2 cores with
``taskset``), ``vshape(2)``: the searched schedule lowered as planned and
with its ticks compacted, both checked equal (loss and gradients), then
timed once per round in shuffled order. Prints and writes (JSON) each
one's ticks, median wall and process CPU ms, the paired per-round ratios
and the load average. Models: ``mlp`` (the issue's 4 x 1024 MLP, 256 rows
per micro-batch) and ``resnet18`` (``experiments.resnet``, the placed
part's ResNet18, placed once).
"""

import json
import os

from absl import flags

from experiments import cli, rel_err, xla_env

flags.DEFINE_enum("model", "mlp", ["mlp", "resnet18"], "Model.")
flags.DEFINE_integer("n", 8, "Micro-batches.")
flags.DEFINE_integer("rounds", 9, "Timed rounds (each variant once each).")
flags.DEFINE_string("output", "out/tick_order_bench.json",
                    "Where to write the JSON results ('': stdout only).")


def _variant(on, fn, params, batch, n, placed):
  """``(run, step)`` of the schedule lowered with compaction ``on``."""
  import jax  # pylint: disable=import-outside-toplevel
  import tessel_jax as tj  # pylint: disable=import-outside-toplevel
  from tessel_jax import placements  # pylint: disable=import-outside-toplevel
  from tessel_jax.passes.switches import Switches  # pylint: disable=import-outside-toplevel
  mesh = jax.make_mesh((2,), ("pipe",),
                       axis_types=(jax.sharding.AxisType.Auto,))
  step = tj.schedule(fn, mesh=mesh, placement=placements.vshape(2),
                     num_microbatches=n, cut="markers", cost="uniform",
                     switches=Switches(tick_order=on))
  p = step.place(params, batch) if placed else params
  compiled = step.lower(p, batch).compile()
  return (lambda: compiled(p, batch)), step


def main(argv):
  cli.no_arguments(argv)
  f = flags.FLAGS
  cli.check_created(f.output, "--output", suffixes=(".json",))
  xla_env.add_xla_flags(xla_env.cpu_flags(2, single_thread=True))
  import jax  # pylint: disable=import-outside-toplevel
  from experiments import lowering_bench_lib as lb  # pylint: disable=import-outside-toplevel
  from experiments import placed_bench as pb  # pylint: disable=import-outside-toplevel
  if f.model == "mlp":
    fn, params = lb.chain_model(2, 1024, 2)
    batch = lb.make_batch(f.n * 256, 1024)
  else:
    fn, params, batch = pb.model("resnet18_auto", f.n)
  placed = f.model == "resnet18"
  runs, steps = {}, {}
  for on, name in ((False, "planned"), (True, "compacted")):
    runs[name], steps[name] = _variant(on, fn, params, batch, f.n, placed)
  outs = {k: r() for k, r in runs.items()}
  grads = {k: steps[k].unplace(o[1]) if placed else o[1]
           for k, o in outs.items()}
  err = rel_err.max_rel(grads["compacted"], grads["planned"])
  if err > 1e-5 or float(outs["compacted"][0]) != float(outs["planned"][0]):
    raise AssertionError(f"compacted ticks differ: gradient rel. err {err}")
  times, _ = pb.shuffled_rounds(runs, f.rounds)
  med = lambda xs: sorted(xs)[len(xs) // 2]
  row = {"model": f.model, "n": f.n, "rounds": f.rounds,
         "load_average": os.getloadavg()}
  for k, ts in times.items():
    row[k] = {"ticks": steps[k].built.plan.loop_summary(),
              "wall_ms": round(1e3 * med([t[0] for t in ts]), 1),
              "cpu_ms": round(1e3 * med([t[1] for t in ts]), 1)}
  pairs = list(zip(times["compacted"], times["planned"]))
  row["paired_wall"] = round(med([a[0] / b[0] for a, b in pairs]), 3)
  row["paired_cpu"] = round(med([a[1] / b[1] for a, b in pairs]), 3)
  text = json.dumps(row)
  print(text, flush=True)
  del jax
  if f.output:
    os.makedirs(os.path.dirname(f.output) or ".", exist_ok=True)
    with open(f.output, "w") as out:
      out.write(text)



if __name__ == "__main__":
  cli.run(main)
