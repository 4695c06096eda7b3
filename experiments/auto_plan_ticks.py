"""What separates one placement's schedules as lowered (README GPT).

  python -m experiments.auto_plan_ticks --placement=interleaved --pipe=2 \\
      --dp=2 --cost=calibrated

Builds the searched plan of ``placement`` (pipe x data on 4 fake CPU
devices, N = 8, as ``experiments.auto_plan`` prices it) and prints, for it
and each classic schedule of the placement, one JSON line: its tick plan
(segments, ticks), the rendezvous of its held remote rounds, the held
rounds, its makespan, and its replay as lowered with and without the
per-tick seconds the searched plan's stand-in measured
(``step.replay_run``, what ``plan_pricing.baseline_price`` scales by).
"""

import json
import sys
import tempfile

from absl import flags

from experiments import cli

flags.DEFINE_string("placement", "interleaved", "Named placement.")
flags.DEFINE_integer("pipe", 2, "Devices per pipeline.")
flags.DEFINE_integer("dp", 2, "Data-parallel width (pipe x dp devices).")
flags.DEFINE_enum("cost", "calibrated", ["measured", "calibrated"],
                  "tj.schedule cost= option.")
flags.DEFINE_list("schedules", ["gpipe", "1f1b", "interleaved_1f1b"],
                  "Classic schedules to list beside the searched one.")
flags.DEFINE_string("cache_dir", None, "Measurement and schedule cache"
                    " (default: a fresh temporary directory).")


def main(argv: list[str]) -> None:
  cli.no_arguments(argv)
  f = flags.FLAGS
  from experiments import auto_plan_start  # pylint: disable=import-outside-toplevel
  s = auto_plan_start.start(f.pipe * f.dp)
  from tessel_jax import plans  # pylint: disable=import-outside-toplevel
  from tessel_jax.cost import ticks  # pylint: disable=import-outside-toplevel
  from tessel_jax.search import baselines  # pylint: disable=import-outside-toplevel
  args, params, batch = s.args, s.params, s.batch
  ff = plans.FrontierFunction(
      s.fn, mesh=s.mesh, pipe_axis="pipe", mode="train", cost=f.cost,
      solver_time_limit_s=5, optimizer_slots=2, has_aux=s.has_aux,
      cache_dir=f.cache_dir or tempfile.mkdtemp(prefix="auto_plan_ticks_"))
  step = ff.step_for(plans.Candidate(f.placement, f.pipe, f.dp,
                                     args.microbatches), s.markers)
  built = step.build(params, batch)
  rr = step.replay_run
  print(json.dumps({"stand-in per tick ms": round(rr.extra_s * 1e3, 4),
                    "predicted_ms": built.report.predicted_step_ms}))

  def show(name: str, run: object, plan: object) -> None:
    model = ticks.tick_model(plan, rr.costs.link, None, rendezvous=True)
    bare = rr.model.replay_like(rr.costs, run, plan, rr.mesh, rr.pipe_axis,
                                0.0)
    print(json.dumps({
        "schedule": name, "segments": plan.loop_summary(),
        "ticks": len(plan.ticks), "makespan": run.makespan,
        "rendezvous": len(model.barriers_after),
        "held_rounds": sum(len(s.sends) for s in plan.interps.values()),
        "replay_ms": round(1e3 * rr(run, plan), 3),
        "replay_without_standin_ms": round(1e3 * bare, 3)}), flush=True)
  show("searched", built.unrolled, built.plan)
  for name in f.schedules:
    try:
      run = baselines.run(name, built.graph, args.microbatches // f.dp)
    except Exception as err:  # pylint: disable=broad-except
      print(json.dumps({"schedule": name, "error": str(err)[:200]}))
      continue
    show(name, run, rr.make_plan(run.actions))
  sys.exit(0)


if __name__ == "__main__":
  cli.run(main)
