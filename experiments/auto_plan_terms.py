"""The terms of ``placement="auto"``'s price of each schedule of one
placement, width and N, beside each program's measured step.

  python -m experiments.auto_plan_terms --placement=interleaved \
      --plans=searched,1f1b,interleaved_1f1b,gpipe --rounds=21

Builds the searched plan (``cost="calibrated"``, as ``experiments.auto_plan``)
and prices every classic schedule on its build as the choice does
(``plans.FrontierFunction.price_baseline``: the replay ratio), then splits
each schedule's replay into its terms: kernels alone (no per-tick cost),
ticks alone (zero-time kernels: the microbenchmark's tick model plus the
stand-in's extra per tick), the whole replay, and the serial part (FSDP,
packing and unpacking) added to every plan; ``priced_stash_ms``: the price
with the stash term (``FrontierFunction(price_stash=True)``). Then compiles every plan (the
searched one twice: the second is the control, the noise floor) and times
them in shuffled interleaved rounds, wall and process CPU, each over the
searched plan per round (paired medians). Writes JSON.
"""

from __future__ import annotations

import json
import os
import resource
import statistics
import sys

from absl import flags

from experiments import cli

flags.DEFINE_string("model", "readme_gpt", "As experiments.auto_plan.")
flags.DEFINE_string("placement", "interleaved", "Placement name.")
flags.DEFINE_integer("pipe", 2, "Devices per pipeline.")
flags.DEFINE_integer("dp", 2, "Data-parallel replicas.")
flags.DEFINE_integer("microbatches", 8, "Micro-batches N (all replicas).")
flags.DEFINE_list("plans", ["searched", "1f1b", "interleaved_1f1b", "gpipe"],
                  "searched and/or classic schedule names.")
flags.DEFINE_integer("rounds", 21, "Timed rounds (0: price only).")
flags.DEFINE_string("cache_dir", None, "Measurement/schedule cache.")
flags.DEFINE_string("output", "", "JSON results ('': none).")


def terms(rr, unrolled, plan=None) -> dict:
  """Milliseconds of ``unrolled``'s replay on the build of ``rr`` (a
  ``step_build.RunReplay``): whole, kernels alone, ticks alone; ticks and
  ports of its tick plan."""
  from tessel_jax.cost import ticks as _ticks  # pylint: disable=import-outside-toplevel
  plan = plan if plan is not None else rr.make_plan(unrolled.actions)
  model = rr.model._tick_model(rr.costs, unrolled, plan, rr.mesh,  # pylint: disable=protected-access
                               rr.pipe_axis).plus_calls(
                                   rr.extra_s, _ticks.kernel_calls(plan))
  bare = _ticks.TickModel(barriers={}, tick_costs={}, edge_delays=True)
  rep = rr.model._replay  # pylint: disable=protected-access
  return {"replay_ms": 1e3 * rep(rr.costs, unrolled, model).step_seconds,
          "kernels_ms": 1e3 * rep(rr.costs, unrolled, bare).step_seconds,
          "ticks_only_ms": 1e3 * rep(rr.costs, unrolled, model,
                                     idle=True).step_seconds,
          "barrier_ms": 1e3 * model.barrier_seconds,
          "ticks": len(plan.ticks),
          "ports": sum(_ticks.tick_ports(t) for t in plan.ticks),
          "loops": plan.loop_summary()}


def temp_bytes(exe) -> int | None:
  """XLA's temp buffer bytes of a compiled program (None: not reported)."""
  try:
    return int(exe.memory_analysis().temp_size_in_bytes)
  except Exception:  # pylint: disable=broad-except
    return None


def rusage_per_step(exe, params, batch, calls: int = 5) -> dict:
  """Median user and system CPU milliseconds and minor page faults of one
  call of ``exe`` (process ``getrusage`` around each of ``calls`` calls)."""
  import jax  # pylint: disable=import-outside-toplevel
  got = []
  for _ in range(calls):
    r0 = resource.getrusage(resource.RUSAGE_SELF)
    jax.block_until_ready(exe(params, batch))
    r1 = resource.getrusage(resource.RUSAGE_SELF)
    got.append((1e3 * (r1.ru_utime - r0.ru_utime),
                1e3 * (r1.ru_stime - r0.ru_stime),
                r1.ru_minflt - r0.ru_minflt))
  return {k: round(statistics.median(g[i] for g in got), 3)
          for i, k in enumerate(("user_ms", "sys_ms", "minflt"))}


def main(argv: list[str]) -> None:
  cli.no_arguments(argv)
  f = flags.FLAGS
  from experiments import auto_plan_start  # pylint: disable=import-outside-toplevel
  s = auto_plan_start.start(f.pipe * f.dp, microbatches=f.microbatches,
                            model=f.model)
  from experiments import auto_plan_lib as apl  # pylint: disable=import-outside-toplevel
  from tessel_jax import plans  # pylint: disable=import-outside-toplevel
  from tessel_jax.search import baselines  # pylint: disable=import-outside-toplevel
  ff = plans.FrontierFunction(
      s.fn, mesh=s.mesh, pipe_axis="pipe", mode="train", cost="calibrated",
      cache_dir=f.cache_dir, solver_time_limit_s=5.0, optimizer_slots=2,
      has_aux=s.has_aux)
  base_c = plans.Candidate(f.placement, f.pipe, f.dp, f.microbatches)
  base = ff.price(base_c, s.params, s.batch, s.markers)
  step = ff.steps[base_c]
  built, rr = step.built, step.replay_run
  rep = built.report
  serial = float(rep.fsdp_collective_ms or 0) + float(rep.outside_ms or 0)
  rows, compiled = [], {}
  for name in f.plans:
    if name == "searched":
      row = {"plan": name, "priced_ms": base.step,
             "priced_stash_ms": base.step,
             "peak_bytes": list(base.peak_bytes_per_device),
             **terms(rr, built.unrolled, built.plan)}
      exe = step.lower(s.params, s.batch).compile()
    else:
      c = plans.Candidate(f.placement, f.pipe, f.dp, f.microbatches, name)
      priced = ff.price_baseline(c, base)
      ff.price_stash = True
      stashed = ff.price_baseline(c, base)
      ff.price_stash = False
      run = baselines.run(name, built.graph, f.microbatches // f.dp)
      row = {"plan": name, "priced_ms": priced.step,
             "priced_stash_ms": stashed.step,
             "peak_bytes": list(priced.peak_bytes_per_device),
             **terms(rr, run)}
      exe = ff.step_for(c, s.markers).lower(s.params, s.batch).compile()
    row.update(serial_ms=serial, extra_per_call_us=1e6 * rr.extra_s,
               temp_bytes=temp_bytes(exe))
    compiled[len(rows)] = exe
    rows.append(row)
    print(json.dumps({k: (round(v, 3) if isinstance(v, float) else v)
                      for k, v in row.items()}), flush=True)
  if f.rounds:
    compiled[len(rows)] = ff.step_for(base_c, s.markers).lower(
        s.params, s.batch).compile()
    rows.append({"plan": "searched (control)"})
    per_round: dict = {}
    apl.interleaved_steps(compiled, s.params, s.batch, f.rounds,
                          rounds=per_round)
    first = per_round[0]
    for i, row in enumerate(rows):
      mine = per_round[i]
      row["measured_ms"] = [round(1e3 * statistics.median(x[k] for x in mine),
                                  3) for k in (0, 1)]
      row["paired_x_searched"] = [round(statistics.median(
          a[k] / b[k] for a, b in zip(mine, first)), 4) for k in (0, 1)]
      row.update(rusage_per_step(compiled[i], s.params, s.batch))
      print(f"{row['plan']:>20}: priced {row.get('priced_ms', 0):7.2f} ms"
            f" (stash term {row.get('priced_stash_ms', 0):7.2f})"
            f" measured {row['measured_ms']} (wall, CPU) paired x searched"
            f" {row['paired_x_searched']}; per step user/sys"
            f" {row['user_ms']}/{row['sys_ms']} ms, {row['minflt']} minor"
            f" faults, temp {row.get('temp_bytes')} B", flush=True)
  print(f"load average {os.getloadavg()}")
  if f.output:
    with open(f.output, "w", encoding="utf-8") as out:
      json.dump({"rows": rows, "load": os.getloadavg(),
                 "flags": {k: getattr(f, k) for k in (
                     "model", "placement", "pipe", "dp", "microbatches",
                     "plans", "rounds")}}, out, indent=1, default=str)
  sys.exit(0)


if __name__ == "__main__":
  cli.run(main)
