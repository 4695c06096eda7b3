"""Where the 4-stage programs of ``peer_bench`` spend a step.

Usage (4 fake devices)::

  python -m experiments.mshape_profile --n=8 --repeats=3
  python -m experiments.mshape_profile --variants=tj_gpipe,tj_mshape,tj_zbv
  python -m experiments.mshape_profile --ab_straight_order=6
  python -m experiments.mshape_profile --ab_residual_trim=8
  python -m experiments.mshape_profile --ab_row_dots=10 --variants=tj_mshape
  python -m experiments.mshape_profile --pick_builds=6 --pick_busy=2 \
      --variants=tj_mshape
  python -m experiments.mshape_profile --pick_builds=2 --pick_aligned \
      --variants=tj_zbv
  python -m experiments.mshape_profile --ab_shared_w=16 --variants=tj_zbv
  python -m experiments.mshape_profile --ab_w_kernels=20
  python -m experiments.mshape_profile --ab_held_in_kernels=10 \
      --variants=tj_zbv,tj_zbv_compact

Builds ``peer_bench``'s ``tj_gpipe`` (``plan="gpipe"`` on ``vshape(4)``),
``tj_mshape`` and ``tj_zbv`` (8 layers of width 1024, 256 rows per
micro-batch) in one process and splits one step of each by part
(``experiments.step_profile``). Beside the split, each plan's shape as
lowered (:func:`plan_counts`: ticks, device-ticks with no kernel, kernel
runs, remote and local message rounds, gradient ports). Prints one JSON
line per variant and a markdown table.
"""

from __future__ import annotations

import json
import os
import resource
from typing import Any

from absl import flags

from experiments import cli, xla_env

flags.DEFINE_integer("n", 8, "Micro-batches per step.")
flags.DEFINE_integer("repeats", 3, "Profiled steps per variant.")
flags.DEFINE_integer("ab_straight_order", 0, "If > 0: instead of the"
                     " profile, this many interleaved rounds timing each"
                     " variant's CPU per step with unrolled ticks' stash"
                     " writes ordered (the default) and unordered"
                     " (Switches.straight_order, passes.switches), paired"
                     " ratio.")
flags.DEFINE_integer("ab_residual_trim", 0, "If > 0: instead of the"
                     " profile, this many interleaved rounds timing each"
                     " variant's CPU per step with the vjp residuals that B"
                     " rebuilds left out of the stash (the default) and all"
                     " stashed (Switches.residual_trim), both on the"
                     " schedule searched with all stashed, paired ratio.")
flags.DEFINE_integer("ab_row_dots", 0, "If > 0: instead of the profile,"
                     " this many interleaved rounds timing each variant's"
                     " CPU per step with few-row dots' input cotangents as"
                     " (W @ dy.T).T (the default, Switches.row_dots,"
                     " passes.row_dots) and as dy @ W.T, both on the"
                     " schedule searched with dy @ W.T, paired ratio.")
flags.DEFINE_bool("ab_row_dots_forward", False, "With --ab_row_dots:"
                  " instead, the default against the forward also taken"
                  " as (W.T @ x.T).T (Switches.row_dots_forward).")
flags.DEFINE_integer("ab_shared_w", 0, "If > 0: instead of the profile,"
                     " this many interleaved rounds timing each variant's"
                     " CPU per step with a split backward's W reading what B"
                     " computes for both (Switches.shared_w, passes.w_split)"
                     " and redoing it (the default), both on the schedule"
                     " searched with the default, paired ratio.")
flags.DEFINE_integer("ab_held_in_kernels", 0, "If > 0: instead of the"
                     " profile, this many interleaved rounds timing each"
                     " variant's CPU per step with interpreted segments'"
                     " held remote messages copied into their outboxes by"
                     " the kernels that made them"
                     " (Switches.held_in_kernels, the default) and by"
                     " every device at every boundary, both on the"
                     " schedule searched with the latter, paired ratio.")
flags.DEFINE_integer("ab_w_kernels", 0, "If > 0: instead of the profile,"
                     " this many shuffled rounds timing zbv(4)'s B and W"
                     " kernels alone per forward block (jit of each kernel,"
                     " CPU per call) with and without Switches.shared_w,"
                     " and the unsplit B of zbv(4, split_backward=False).")
flags.DEFINE_integer("pick_builds", 0, "If > 0: instead of the profile,"
                     " this many cold builds of each variant (measured"
                     " cost, a fresh cache directory each), printing the"
                     " schedule each lowers and its prediction, then the"
                     " distinct programs timed in --pick_rounds shuffled"
                     " rounds (CPU per step, paired against the first"
                     " build's).")
flags.DEFINE_integer("pick_busy", 0, "With --pick_builds: busy processes"
                     " (a Python loop each) running during the builds only,"
                     " as on a loaded machine.")
flags.DEFINE_integer("pick_rounds", 8, "With --pick_builds: timing rounds.")
flags.DEFINE_bool("pick_aligned", False, "With --pick_builds: each build"
                  " twice, with Switches(aligned_grid=False) and with"
                  " Switches(aligned_grid=True) (cost.quantize.aligned),"
                  " alternated.")
flags.DEFINE_list("variants", ["tj_gpipe", "tj_mshape", "tj_zbv"],
                  "peer_bench variants to profile (tj_gpipe, tj_mshape,"
                  " tj_zbv).")


def _cpu_s() -> float:
  """This process's user + system CPU seconds."""
  r = resource.getrusage(resource.RUSAGE_SELF)
  return r.ru_utime + r.ru_stime


def _shuffled_cpu_ms(runs: dict, rounds: int, *args: Any, calls: int = 1
                     ) -> dict[Any, list[float]]:
  """CPU ms per call of each of ``runs`` on ``args`` per round (a warm call
  first, then the mean of ``calls`` calls), the runs in a shuffled order
  each round (seed 0)."""
  # pylint: disable=import-outside-toplevel
  import random

  import jax
  cpu: dict[Any, list[float]] = {k: [] for k in runs}
  rng = random.Random(0)
  for _ in range(rounds):
    keys = list(runs)
    rng.shuffle(keys)
    for k in keys:
      jax.block_until_ready(runs[k](*args))
      c0 = _cpu_s()
      for _ in range(calls):
        jax.block_until_ready(runs[k](*args))
      cpu[k].append(1e3 * (_cpu_s() - c0) / calls)
  return cpu


def plan_counts(plan: Any) -> dict[str, int]:
  """What a tick plan does per step, counted from its static tables."""
  ticks = plan.ticks
  return {
      "ticks": len(ticks),
      "idle_device_ticks": sum(k is None for t in ticks for k in t.kernels),
      "kernel_runs": sum(k is not None for t in ticks for k in t.kernels),
      "remote_rounds": sum(r.remote for t in ticks for r in t.sends),
      "local_rounds": sum(not r.remote for t in ticks for r in t.sends),
      "grad_ports": sum(len(t.grads) for t in ticks),
      "stash_mb": round(plan.stash_bytes / 2**20, 1)}


def _inputs(n: int) -> tuple:
  """``(params, batch, mesh)`` of peer_bench's 4-stage MLP (8 layers of
  width 1024, 256 rows per micro-batch) at ``n`` micro-batches."""
  # pylint: disable=import-outside-toplevel
  import jax

  from experiments import lowering_bench_lib as lb
  from experiments import peer_gpipe as pg
  mesh = jax.make_mesh((4,), ("pipe",),
                       axis_types=(jax.sharding.AxisType.Auto,))
  return pg.mlp_params(8, 1024, 0), lb.make_batch(n * 256, 1024, 1), mesh


def profile(n: int = 8, repeats: int = 3,
            variants: tuple[str, ...] = ("tj_gpipe", "tj_mshape", "tj_zbv")
            ) -> None:
  """Profiles ``variants`` at ``n`` micro-batches; prints the table."""
  # pylint: disable=import-outside-toplevel
  import tessel_jax as tj
  from experiments import peer_bench_lib as pbl
  from experiments import step_profile
  params, batch, mesh = _inputs(n)
  runs = {}
  for name in variants:
    placement, blocks = pbl.tj_layout(name, 8, 4)
    step = tj.schedule(pbl.marked_loss(blocks), mesh=mesh,
                       placement=placement, num_microbatches=n,
                       plan="gpipe" if name == "tj_gpipe" else None,
                       cut="markers")
    built = step.build(params, batch)
    compiled = built.jitted.lower(params, batch).compile()
    runs[name] = (compiled, built.plan.loop_summary(),
                  plan_counts(built.plan))
  rows = []
  for name, (compiled, summary, counts) in runs.items():
    c0 = _cpu_s()
    prof = step_profile.profile_step(lambda c=compiled: c(params, batch),
                                     compiled.as_text(), 4, repeats)
    cpu = (_cpu_s() - c0) / (repeats + 1)
    row = {"model": "mlp8", "plan": name, "n": n, "lowered_as": summary,
           "cpu_ms_per_step": round(1e3 * cpu, 1), **counts, **prof}
    print(json.dumps({"profiled": row}), flush=True)
    rows.append(row)
  print(step_profile.markdown(rows))
  print("load", os.getloadavg())


def ab_straight_order(n: int, rounds: int, variants: tuple[str, ...]
                      ) -> None:
  """CPU per step with unrolled ticks' stash writes ordered / unordered,
  both built in this process and timed alternately (shuffled per round)."""
  ab(n, rounds, variants, {"straight_order": False}, ("ordered", "unordered"))


def ab(n: int, rounds: int, variants: tuple[str, ...], off: dict[str, bool],
       names: tuple[str, str], on: dict[str, bool] | None = None) -> None:
  """CPU per step of each variant built with the library's switches
  (``names[0]``; ``Switches(**on)`` where given) and with
  ``Switches(**off)`` (``names[1]``), on one schedule (the one searched with
  ``off``), in this process, timed alternately (shuffled per round); prints
  the medians and the paired ratio on / off."""
  # pylint: disable=import-outside-toplevel
  import numpy as np

  import tessel_jax as tj
  from experiments import peer_bench_lib as pbl
  from tessel_jax.passes.switches import Switches
  params, batch, mesh = _inputs(n)
  on_switches = on
  runs = {}
  for name in variants:
    sched = None
    for on in (False, True):
      placement, blocks = pbl.tj_layout(name, 8, 4)
      built = tj.schedule(  # as peer_bench builds its tj variants
          pbl.marked_loss(blocks), mesh=mesh, placement=placement,
          num_microbatches=n,
          plan=sched or ("gpipe" if name == "tj_gpipe" else None),
          cut="markers",
          interpret_ramps=0 if name.endswith("_compact") else 8,
          switches=Switches(**(on_switches or {})) if on
          else Switches(**off)).build(params, batch)
      compiled = built.jitted.lower(params, batch).compile()
      sched = built.unrolled
      runs[(name, on)] = compiled
      print(json.dumps({"variant": name, names[1 - on]: True,
                        "lowered_as": built.plan.loop_summary(),
                        "stash_mb": round(built.plan.stash_bytes / 2**20, 1),
                        "temp_mb": round(compiled.memory_analysis()
                                         .temp_size_in_bytes / 1e6, 1)}),
            flush=True)
  cpu = _shuffled_cpu_ms(runs, rounds, params, batch)
  for name in variants:
    on_, off_ = cpu[(name, True)], cpu[(name, False)]
    print(json.dumps({
        "variant": name, f"cpu_ms_{names[0]}": round(float(np.median(on_)), 1),
        f"cpu_ms_{names[1]}": round(float(np.median(off_)), 1),
        "paired_ratio": round(float(np.median(
            [a / b for a, b in zip(on_, off_)])), 4),
        "load_average": os.getloadavg()}), flush=True)


def _zbv_kernels(n: int, params: Any, batch: Any, mesh: Any) -> dict:
  """``{(setting, kind, forward index): Kernel}`` of zbv(4)'s B and W with
  and without ``Switches.shared_w`` (one schedule) and the unsplit B."""
  # pylint: disable=import-outside-toplevel
  import tessel_jax as tj
  from experiments import peer_bench_lib as pbl
  from tessel_jax import placements
  from tessel_jax.passes.switches import Switches
  placement, blocks = pbl.tj_layout("tj_zbv", 8, 4)
  settings = (("redone", placement, {}), ("shared", placement,
                                          {"shared_w": True}),
              ("unsplit", placements.zbv(4, split_backward=False), {}))
  out, sched = {}, None
  for name, graph, switches in settings:
    built = tj.schedule(pbl.marked_loss(blocks), mesh=mesh, placement=graph,
                        num_microbatches=n, cut="markers",
                        plan=sched if name != "unsplit" else None,
                        switches=Switches(**switches)).build(params, batch)
    sched = sched or built.unrolled
    print(json.dumps({"setting": name,
                      "lowered_as": built.plan.loop_summary(),
                      "stash_mb": round(built.plan.stash_bytes / 2**20, 1)}),
          flush=True)
    for k in built.kernels.kernels.values():
      if k.kind in ("B", "W"):
        out[(name, k.kind, k.fwd)] = k
  return out


def ab_w_kernels(n: int, rounds: int) -> None:
  """zbv(4)'s B and W kernels timed alone (CPU per call, shuffled rounds),
  W redoing B's work / W reading it (``Switches.shared_w``), beside the
  unsplit B; prints per forward block the medians and the paired ratio
  of B + W shared / redone."""
  # pylint: disable=import-outside-toplevel
  import jax
  import numpy as np
  params, batch, mesh = _inputs(n)
  kernels = _zbv_kernels(n, params, batch, mesh)
  leaves = jax.tree_util.tree_leaves(params)
  rng = np.random.default_rng(0)
  calls = {}
  for key, k in kernels.items():
    ivals = [jax.numpy.asarray(rng.standard_normal(a.shape).astype(a.dtype))
             for a in k.in_avals]
    f = jax.jit(lambda p, i, k=k: k.fn({"row_offset": 0}, p, i))
    p = [leaves[l] for l in k.params]
    calls[key] = lambda f=f, p=p, i=ivals: f(p, i)
  cpu = _shuffled_cpu_ms(calls, rounds, calls=3)
  med = lambda xs: round(float(np.median(xs)), 3)
  for fwd in sorted({key[2] for key in calls}):
    bw = {s: [b + w for b, w in zip(cpu[(s, "B", fwd)], cpu[(s, "W", fwd)])]
          for s in ("redone", "shared")}
    print(json.dumps({
        "forward": fwd, "unsplit_b_ms": med(cpu[("unsplit", "B", fwd)]),
        **{f"{s}_{kind}_ms": med(cpu[(s, kind, fwd)])
           for s in ("redone", "shared") for kind in ("B", "W")},
        "redone_bw_ms": med(bw["redone"]), "shared_bw_ms": med(bw["shared"]),
        "paired_bw_shared_over_redone": round(float(np.median(
            [a / b for a, b in zip(bw["shared"], bw["redone"])])), 4),
        "load_average": os.getloadavg()}), flush=True)


def _busy(count: int) -> list[Any]:
  """``count`` processes spinning a core each (the caller kills them)."""
  # pylint: disable=import-outside-toplevel
  import subprocess
  import sys
  return [subprocess.Popen([sys.executable, "-c", "while True: pass"])
          for _ in range(count)]


def _cold_build(name: str, n: int, params: Any, batch: Any, mesh: Any,
                switches: Any = None) -> tuple[Any, dict[str, Any]]:
  """``(compiled, row)`` of one measured-cost build of ``name`` with a
  fresh cache directory, as peer_bench builds its tj variants
  (``switches``: None, the library's)."""
  # pylint: disable=import-outside-toplevel
  import tempfile

  import tessel_jax as tj
  from experiments import peer_bench_lib as pbl
  placement, blocks = pbl.tj_layout(name, 8, 4)
  with tempfile.TemporaryDirectory() as cache:
    built = tj.schedule(pbl.marked_loss(blocks), mesh=mesh,
                        placement=placement, num_microbatches=n,
                        cut="markers", cost="measured", interpret_ramps=8,
                        cache_dir=cache, switches=switches
                        ).build(params, batch)
  rep = built.report
  row = {"variant": name, "lowered_as": built.plan.loop_summary(),
         "schedule_costs": rep.schedule_costs,
         "predicted_ms": round(rep.predicted_step_ms, 1),
         "other_predicted_ms": (None if rep.alternative_ms is None else
                                round(rep.alternative_ms, 1)),
         "resolution_ms": round(1e3 * rep.time_resolution_s, 3),
         "build_s": round(built.build_seconds, 2)}
  return built.jitted.lower(params, batch).compile(), row


def pick(n: int, builds: int, busy: int, rounds: int,
         variants: tuple[str, ...], aligned: bool = False) -> None:
  """``builds`` cold builds of each variant (``busy`` spinning processes
  beside them; ``aligned``: each with ``Switches(aligned_grid=False)`` and
  ``Switches(aligned_grid=True)``,
  alternated); then each variant's distinct lowered programs timed in
  shuffled rounds, CPU per step and paired against the first build's."""
  # pylint: disable=import-outside-toplevel
  import numpy as np

  from tessel_jax.passes.switches import Switches
  params, batch, mesh = _inputs(n)
  programs: dict[tuple[str, str], Any] = {}
  settings = ((Switches(aligned_grid=False), Switches(aligned_grid=True))
              if aligned else (None,))
  for name in variants:
    for b, switches in ((b, s) for b in range(builds) for s in settings):
      spin = _busy(busy)
      try:
        compiled, row = _cold_build(name, n, params, batch, mesh, switches)
      finally:
        for p in spin:
          p.kill()
          p.wait()
      programs.setdefault((name, row["lowered_as"]), compiled)
      print(json.dumps({"build": b, "busy": busy,
                        "aligned_grid": (switches or Switches()).aligned_grid,
                        **row,
                        "load_average": os.getloadavg()}), flush=True)
  cpu = _shuffled_cpu_ms(programs, rounds, params, batch)
  for name in variants:
    keys = [k for k in programs if k[0] == name]
    for k in keys:
      print(json.dumps({
          "variant": name, "lowered_as": k[1],
          "cpu_ms": round(float(np.median(cpu[k])), 1),
          "paired_vs_first": round(float(np.median(
              [a / b for a, b in zip(cpu[k], cpu[keys[0]])])), 4),
          "load_average": os.getloadavg()}), flush=True)


def main(argv: list[str]) -> None:
  """The binary: 4 fake CPU devices, then :func:`main` on the flags."""
  cli.no_arguments(argv)
  xla_env.add_xla_flags(xla_env.cpu_flags(4))
  f = flags.FLAGS
  if f.pick_builds > 0:
    pick(f.n, f.pick_builds, f.pick_busy, f.pick_rounds, tuple(f.variants),
         f.pick_aligned)
  elif f.ab_shared_w > 0:
    ab(f.n, f.ab_shared_w, tuple(f.variants), {}, ("shared_w", "w_redone"),
       on={"shared_w": True})
  elif f.ab_held_in_kernels > 0:
    ab(f.n, f.ab_held_in_kernels, tuple(f.variants),
       {"held_in_kernels": False}, ("held_in_kernels", "held_at_boundary"),
       on={"held_in_kernels": True})
  elif f.ab_w_kernels > 0:
    ab_w_kernels(f.n, f.ab_w_kernels)
  elif f.ab_straight_order > 0:
    ab_straight_order(f.n, f.ab_straight_order, tuple(f.variants))
  elif f.ab_residual_trim > 0:
    ab(f.n, f.ab_residual_trim, tuple(f.variants), {"residual_trim": False},
       ("trimmed", "all_stashed"))
  elif f.ab_row_dots > 0:
    if f.ab_row_dots_forward:
      ab(f.n, f.ab_row_dots, tuple(f.variants), {"row_dots_forward": True},
         ("backward_only", "forward_too"))
    else:
      ab(f.n, f.ab_row_dots, tuple(f.variants), {"row_dots": False},
         ("weight_lhs", "weight_rhs"))
  else:
    profile(f.n, f.repeats, tuple(f.variants))


if __name__ == "__main__":
  cli.run(main)
