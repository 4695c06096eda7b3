"""Lowering variants of the placed ResNet18 step, paired, with their floors.

  taskset -c 0,1 python -m experiments.resnet_ab --variants=base,ticks --rounds=7

One process, 2 fake single-threaded CPU devices, ``vshape(2)``, N = 8,
``param_layout="auto"``, ``cost="uniform"``: the placed part's
``resnet18_auto`` (``experiments.placed_bench``). Each variant is the same
step lowered another way (``VARIANTS``), placed once, checked against the
first variant's gradients, then every variant is timed once per round in
shuffled order (wall and process CPU ms, load average). For each one a
traced step gives its kernels' in-program time and the three floors of
``experiments.lowering_bench_floors`` (busiest device, per-tick lockstep,
slowest device between rendezvous) and the step split by part
(``experiments.step_profile``). Paired ratios are against the first
variant.
"""

import json
import os
import statistics

from absl import flags

from experiments import cli, rel_err, xla_env
from experiments.resnet_variants import VARIANTS, build as _build, check_names

flags.DEFINE_list("variants", ["base", "ticks"],
                  f"Variants, the first the reference: {sorted(VARIANTS)}.")
flags.DEFINE_integer("n", 8, "Micro-batches.")
flags.DEFINE_integer("rounds", 7, "Timed rounds (each variant once each).")
flags.DEFINE_bool("profile", True, "Also split one traced step by part.")
flags.DEFINE_integer("timeline", 0,
                     "Also trace this many steps and split each per device"
                     " and rendezvous interval (experiments.device_timeline;"
                     " the minimum over the traces per part).")
flags.DEFINE_string("output", "out/resnet_ab.json",
                    "Where to write the JSON results ('': stdout only).")



def main(argv):
  cli.no_arguments(argv)
  f = flags.FLAGS
  cli.check_created(f.output, "--output", suffixes=(".json",))
  check_names(f.variants)
  xla_env.add_xla_flags(xla_env.cpu_flags(2, single_thread=True))
  from experiments import lowering_bench_floors as floors  # pylint: disable=import-outside-toplevel
  from experiments import placed_bench as pb  # pylint: disable=import-outside-toplevel
  from experiments import step_profile  # pylint: disable=import-outside-toplevel
  fn, params, batch = pb.model("resnet18_auto", f.n)
  built = {v: _build(v, fn, params, batch, f.n) for v in f.variants}
  ref = f.variants[0]
  want = built[ref][1].unplace(built[ref][0]()[1])
  for v, (run, step, _) in built.items():
    err = rel_err.max_rel(step.unplace(run()[1]), want)
    if err > 1e-5:
      raise AssertionError(f"{v}: gradient rel. error {err} against {ref}")
  times, loads = pb.shuffled_rounds({v: b[0] for v, b in built.items()},
                                    f.rounds)
  rows = {}
  for v, (run, step, compiled) in built.items():
    ts = times[v]
    pairs = list(zip(ts, times[ref]))
    events, _ = step_profile.trace_events(run)
    text = compiled.as_text()
    row = {"lowered_as": step.built.plan.loop_summary(),
           "cut_at": _cut_at(step),
           "wall_ms": round(1e3 * statistics.median_high([t[0] for t in ts]), 1),
           "cpu_ms": round(1e3 * statistics.median_high([t[1] for t in ts]), 1),
           "sys_ms": round(1e3 * statistics.median_high([t[2] for t in ts]), 1),
           "faults": statistics.median_high([t[3] for t in ts]),
           "paired_wall": round(statistics.median_high([a[0] / b[0] for a, b in pairs]), 3),
           "paired_cpu": round(statistics.median_high([a[1] / b[1] for a, b in pairs]), 3),
           "temp_mb": round(
               compiled.memory_analysis().temp_size_in_bytes / 1e6, 1),
           **floors.floors(step.built.plan,
                           step_profile.kernel_seconds(events, text)),
           **floors.inclusive_floors(step.built.plan,
                                     floors.kernel_parts(events, text))}
    if f.profile:
      row["profile"] = step_profile.profile_step(run, text, 2, 3)
    if f.timeline:
      row["timeline"] = _timeline(run, step.built.plan, text, f.timeline)
    rows[v] = row
    print(json.dumps({v: row}), flush=True)
  out = {"n": f.n, "rounds": f.rounds, "variants": rows,
         "load_average": [round(min(loads), 1), round(max(loads), 1)]}
  print(markdown(out), flush=True)
  if f.timeline:
    print(timeline_markdown(out), flush=True)
  if f.output:
    os.makedirs(os.path.dirname(f.output) or ".", exist_ok=True)
    with open(f.output, "w") as fh:
      json.dump(out, fh, indent=1)


def _cut_at(step):
  """The automatic cut's equation positions (None: the model's markers)."""
  from tessel_jax.passes import autocut  # pylint: disable=import-outside-toplevel
  info = autocut.cut_info(step.built.partition.traced)
  return None if info is None else list(info.positions)


def _timeline(run, plan, text, traces):
  """Per device, the minimum over ``traces`` traced steps of each part
  (``experiments.device_timeline``), the wall and the two threads'
  overlap of the fastest trace."""
  from experiments import device_timeline  # pylint: disable=import-outside-toplevel
  from experiments import step_profile  # pylint: disable=import-outside-toplevel
  kernels = plan.kernels
  items = kernels.items() if hasattr(kernels, "items") else enumerate(kernels)
  device_of = {k: tuple(kernel.devices) for k, kernel in items}
  got = []
  for _ in range(traces):
    events, wall = step_profile.trace_events(run)
    got.append((wall, device_timeline.per_device(events, text, device_of, 2),
                device_timeline.busy_overlap(events, text)))
  got.sort(key=lambda g: g[0])
  mins = []
  for d in range(2):
    keys = set().union(*[g[1]["devices"][d] for g in got])
    mins.append({k: min(g[1]["devices"][d].get(k, 0.0) for g in got)
                 for k in sorted(keys)})
  return {"min_ms_by_device": mins, "fastest_wall_ms": round(1e3 * got[0][0], 1),
          "fastest_overlap": got[0][2],
          "fastest_intervals": got[0][1]["intervals"]}


def markdown(out):
  """One line per variant: times, floors and the step against them."""
  head = ["variant", "lowered as", "wall ms (CPU)", "paired wall, CPU",
          "busiest device kernels", "lockstep floor", "sync floor",
          "wall / busiest, / sync", "with their reads and accumulation:"
          " by device, sync floor", "wall / that floor", "system CPU ms",
          "faults",
          "temp MB", "load"]
  lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
  load = out["load_average"]
  for v, r in out["variants"].items():
    lines.append("| " + " | ".join([
        v, f"`{r['lowered_as']}`", f"{r['wall_ms']:.0f} ({r['cpu_ms']:.0f})",
        f"{r['paired_wall']}, {r['paired_cpu']}",
        f"{r['in_program_busiest_ms']:.0f} "
        f"{r['in_program_kernel_ms_by_device']}",
        f"{r['lockstep_ms']:.0f}",
        f"{r['sync_floor_ms']:.0f} ({r['rendezvous']} rendezvous)",
        f"{r['wall_ms'] / r['in_program_busiest_ms']:.2f}x,"
        f" {r['wall_ms'] / r['sync_floor_ms']:.2f}x",
        f"{r['inclusive_in_program_kernel_ms_by_device']},"
        f" {r['inclusive_sync_floor_ms']:.0f}",
        f"{r['wall_ms'] / r['inclusive_sync_floor_ms']:.2f}x",
        f"{r.get('sys_ms', float('nan')):.0f}",
        str(r["faults"]), str(r["temp_mb"]),
        f"{load[0]}-{load[1]}"]) + " |")
  return "\n".join(lines)


def timeline_markdown(out):
  """One line per variant and device: the traced steps' minimum per part."""
  head = ["variant", "device", "its kernels", "hoisted parameter work",
          "grad accumulation", "stash", "other", "busy (sum)",
          "ppermute (wait included)", "fastest traced wall, threads overlapping"]
  lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
  for v, r in out["variants"].items():
    tl = r["timeline"]
    for d, p in enumerate(tl["min_ms_by_device"]):
      own = sum(x for k, x in p.items() if k.startswith("k") and k[1:].isdigit())
      rest = {k: p.get(k, 0.0) for k in ("kernels", "grad accumulation",
                                         "stash")}
      other = sum(x for k, x in p.items() if not k.startswith("k")
                  and k not in ("grad accumulation", "stash",
                                "ppermute/rendezvous"))
      busy = own + sum(rest.values()) + other
      lines.append("| " + " | ".join([
          v, str(d), f"{own:.1f}", f"{rest['kernels']:.1f}",
          f"{rest['grad accumulation']:.1f}", f"{rest['stash']:.1f}",
          f"{other:.1f}", f"{busy:.1f}",
          f"{p.get('ppermute/rendezvous', 0.0):.1f}",
          f"{tl['fastest_wall_ms']:.0f}, {tl['fastest_overlap']['overlap_ms']:.0f}"
      ]) + " |")
  return "\n".join(lines)


if __name__ == "__main__":
  cli.run(main)
