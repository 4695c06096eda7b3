"""Why one plan of ``placement="auto"`` measures slower than another priced
the same: their lowered programs side by side.

  python -m experiments.auto_plan_lowering --plans=searched,1f1b \
      --interpret_ramps=8,0 --repeats=7

Builds the README GPT's plans of one placement / width / N (default the
V-shape pipe2 x dp2 N = 8 of ``experiments.auto_plan``, ``cost=
"calibrated"``) under each lowering (``interpret_ramps``), prints each
plan's ticks and segments (straight, loop and interpreted), its remote
messages (``ppermute`` calls per step, in the HLO) and stash slots, its
predicted step, then times every program in interleaved rounds (shuffled,
wall and process CPU) and, with ``--profile``, splits one step by the
lowering's name scopes (``experiments.step_profile``).
"""

from __future__ import annotations

import json
import os
import re
import sys

from absl import flags

from experiments import cli

flags.DEFINE_string("placement", "vshape", "Placement name.")
flags.DEFINE_integer("pipe", 2, "Devices per pipeline.")
flags.DEFINE_integer("dp", 2, "Data-parallel replicas.")
flags.DEFINE_integer("microbatches", 8, "Micro-batches N (all replicas).")
flags.DEFINE_list("plans", ["searched", "1f1b"],
                  "searched and/or classic schedule names.")
flags.DEFINE_list("interpret_ramps", ["8", "0"], "Lowerings to compare.")
flags.DEFINE_integer("repeats", 7, "Timed rounds (median).")
flags.DEFINE_bool("profile", False, "Also split a step by name scope.")
flags.DEFINE_string("cost", "calibrated", "tj.schedule cost= option.")
flags.DEFINE_string("cache_dir", None, "Measurement/schedule cache.")
flags.DEFINE_string("output", "", "JSON results ('': none).")


def describe(built) -> dict:
  """Ticks, segments, messages and prediction of one build."""
  plan = built.plan
  segs = [{"kind": ("loop" if s.is_loop else s.kind), "period": s.period,
           "iterations": s.iterations} for s in plan.segments]
  rep = built.report
  return {"loop_summary": plan.loop_summary(), "segments": segs,
          "makespan": built.unrolled.makespan,
          "source": built.unrolled.source,
          "peak_memory_units": list(built.unrolled.peak_memory),
          "predicted_ms": None if rep is None else rep.predicted_step_ms}


def hlo_counts(text: str) -> dict:
  """Collectives and loops in the compiled HLO text."""
  return {"collective_permute": len(re.findall(r"collective-permute\(",
                                               text)),
          "while": len(re.findall(r" while\(", text)),
          "conditional": len(re.findall(r" conditional\(", text)),
          "all_reduce": len(re.findall(r"all-reduce\(", text)),
          "kchars": len(text) // 1000}


def main(argv: list[str]) -> None:
  cli.no_arguments(argv)
  f = flags.FLAGS
  devices = f.pipe * f.dp
  from experiments import auto_plan_start  # pylint: disable=import-outside-toplevel
  s = auto_plan_start.start(devices, microbatches=f.microbatches)
  from experiments import auto_plan_lib as apl  # pylint: disable=import-outside-toplevel
  from experiments import step_profile  # pylint: disable=import-outside-toplevel
  from tessel_jax import plans  # pylint: disable=import-outside-toplevel
  fn, params, batch, has_aux = s.fn, s.params, s.batch, s.has_aux
  mesh, markers = s.mesh, s.markers
  rows, compiled = [], {}
  for text in f.interpret_ramps:
    ramps = int(text) if text.isdigit() else text   # e.g. "auto"
    ff = plans.FrontierFunction(
        fn, mesh=mesh, pipe_axis="pipe", mode="train", cost=f.cost,
        cache_dir=f.cache_dir, solver_time_limit_s=5.0, optimizer_slots=2,
        has_aux=has_aux, interpret_ramps=ramps)
    for name in f.plans:
      cand = plans.Candidate(f.placement, f.pipe, f.dp, f.microbatches,
                             None if name == "searched" else name)
      step = ff.step_for(cand, markers)
      built = step.build(params, batch)
      row = {"plan": name, "interpret_ramps": ramps, **describe(built)}
      lowered = step.lower(params, batch)
      exe = lowered.compile()
      row.update(hlo_counts(exe.as_text()))
      compiled[len(rows)] = exe
      row["_hlo"] = exe.as_text()
      rows.append(row)
      print(f"{name:>10} ramps={ramps}: {row['loop_summary']} makespan"
            f" {row['makespan']} predicted {row['predicted_ms']:.2f} ms;"
            f" collective-permute {row['collective_permute']} while"
            f" {row['while']} cond {row['conditional']} HLO"
            f" {row['kchars']} kchars", flush=True)
  times = apl.interleaved_steps(compiled, params, batch, f.repeats)
  base = times[0]
  for i, row in enumerate(rows):
    wall, cpu = times[i]
    row.update(measured_ms=round(1e3 * wall, 3),
               measured_cpu_ms=round(1e3 * cpu, 3),
               wall_x_first=round(wall / base[0], 3),
               cpu_x_first=round(cpu / base[1], 3))
    if f.profile:
      row["profile"] = step_profile.profile_step(
          lambda i=i: compiled[i](params, batch), row["_hlo"], devices)
    print(f"{row['plan']:>10} ramps={row['interpret_ramps']}: measured"
          f" {row['measured_ms']:.2f} ms (CPU {row['measured_cpu_ms']:.2f})"
          f" = {row['wall_x_first']:.3f}x wall / {row['cpu_x_first']:.3f}x"
          f" CPU of the first; predicted {row['predicted_ms']:.2f}"
          + (f"\n   profile {row['profile']}" if f.profile else ""),
          flush=True)
  print(f"load average {os.getloadavg()}")
  for row in rows:
    row.pop("_hlo")
  if f.output:
    with open(f.output, "w", encoding="utf-8") as out:
      json.dump({"rows": rows, "load": os.getloadavg()}, out, indent=1)
  sys.exit(0)


if __name__ == "__main__":
  cli.run(main)
