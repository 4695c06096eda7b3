"""The ``placed`` part of ``experiments.lowering_bench`` (no flags here).

A parameter-heavy model on ``vshape(2)``, 2 fake single-threaded CPU devices
pinned to 2 cores: the plain-tree call (parameters packed into the
per-device layout and gradients unpacked every call), the placed call
(``step.place`` once; ``step(placed, batch)``), the fused donating
``step.train_step`` with ``optax.sgd`` when optax is installed, and plain
``jax.jit(jax.value_and_grad)`` on device 0, timed in one process, once
per round in shuffled order (wall and process CPU seconds, load average per
round). Beside them: the sum of the kernels' measured times (each kernel
compiled alone, ``tessel_jax.cost``) along the schedule's busiest device,
and XLA-trace profiles of the tree and placed calls
(``experiments.step_profile``). The placed call is also lowered with its
ticks compacted (``passes.tick_order``; paired against the placed call),
and both are put beside floors from their kernels' in-program times
(``experiments.lowering_bench_floors``): the busiest device's sum, the
tick lockstep's (each tick as long as its slowest kernel) and the sync
floor (the slowest device between two rendezvous: held messages are sent
only where a reader needs them), also over each kernel's whole branch
(its reads and gradient accumulation). Plain jit on one device is also run in its
own process pinned to 1 core and to 2 cores (default Eigen threading).

Models: ``wide`` (4 x 1664 MLP, 11.1M parameters, 32 rows per
micro-batch) and ``resnet18`` (``experiments.resnet``, 11.7M parameters,
16 x 16 images, 4 per micro-batch, cut after basic block 3
(:data:`RESNET_CUT_AFTER`: where ``cut="auto", cost="measured"`` cuts it
since its groups are timed as the ticks run them; block 2 before, where
the analytic cut still lands; block 5 until session 35:
session 34 quietly 0.85x the wall of the old cut after block 5, which put
the fourth stage and the head, 8.9M parameters, alone on device 1;
``experiments.resnet_ab``'s ``cut5`` variant keeps it); ``param_layout="slots"``,
``resnet18_auto``: the same with ``"auto"``, ``resnet18_flat``: with
``"flat"``, one flat buffer per device, which ``"auto"`` picked before).
"""

from __future__ import annotations

import collections
import glob
import gzip
import json
import os
import random
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Mapping
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

import tessel_jax as tj
from experiments import host_pages
from experiments import lowering_bench_floors
from experiments import lowering_bench_lib as lb
from experiments import resnet
from experiments import step_profile
from tessel_jax import placements
from tessel_jax.passes.switches import Switches

MODELS = ("wide", "resnet18", "resnet18_auto", "resnet18_flat")
# param_layout per model: ResNet's leaves have a different shape on each
# device; in one flat buffer per device, whose accumulator every switch of a
# tick with a gradient copies whole, they cost 6.3-10x the CPU of "slots"
# (resnet18_flat, what "auto" chose before it kept leaves of 64 KiB or more
# in half-empty slots: resnet18_auto).
LAYOUTS = {"wide": "auto", "resnet18": "slots", "resnet18_auto": "auto",
           "resnet18_flat": "flat"}
# ResNet18's marker: after basic block 3, equation 64 of its dead-tap jaxpr,
# where the measured automatic cut (``cut="auto", cost="measured"``, groups
# timed as the ticks run them: ``passes.autocut_ticks``) cuts it; after
# block 2 (equation 51, where the analytic cut lands) before session 37:
# the cut after block 3 ran 0.906 and 0.937 of its wall, paired, loaded
# (BENCHMARKS.md, helper "resnet10"). Markers keep the benchmark's program
# the same from run to run (a measured cut moves with the load).
RESNET_CUT_AFTER = (3,)
VARIANTS = ("plain_dev0", "tessel_tree", "tessel_placed", "train_step",
            "placed_nohoist", "placed_ticks")


def model(name: str, n: int) -> tuple[Callable, Any, Any]:
  """``(fn, params, batch)`` of a benchmark model, ``n`` micro-batches."""
  if name == "wide":
    fn, params = lb.chain_model(2, 1664, 2)
    return fn, params, lb.make_batch(n * 32, 1664)
  if name.startswith("resnet18"):
    params = resnet.init(jax.random.PRNGKey(0))
    fn = resnet.make_loss(tj.boundary, cut_after=RESNET_CUT_AFTER)
    return fn, params, resnet.batch(n * 4, image=16)
  raise ValueError(f"unknown model {name!r}; choose from {MODELS}")


def _mean_loss(fn: Callable, batch: Any, n: int) -> Callable:
  def mean_loss(p: Any) -> Any:
    mbs = jax.tree_util.tree_map(
        lambda x: x.reshape((n, -1) + x.shape[1:]), batch)
    return jnp.mean(jax.lax.map(lambda mb: fn(p, mb), mbs))
  return mean_loss


def _timed(fn: Callable[[], Any]) -> tuple[float, float, float, int]:
  """``(wall s, process CPU s, of it system s, minor page faults)``."""
  r0 = resource.getrusage(resource.RUSAGE_SELF)
  t0 = time.perf_counter()
  jax.block_until_ready(fn())
  wall = time.perf_counter() - t0
  r1 = resource.getrusage(resource.RUSAGE_SELF)
  sys_s = r1.ru_stime - r0.ru_stime
  return (wall, (r1.ru_utime - r0.ru_utime) + sys_s, sys_s,
          r1.ru_minflt - r0.ru_minflt)


def shuffled_rounds(runs: dict[str, Callable[[], Any]], rounds: int
                    ) -> tuple[dict[str, list], list[float]]:
  """Each run once per round in shuffled order (:func:`_timed` figures per
  run and round), and the 1-minute load average after each round."""
  times: dict[str, list] = {k: [] for k in runs}
  loads = []
  for _ in range(rounds):
    order = list(runs)
    random.shuffle(order)
    for k in order:
      times[k].append(_timed(runs[k]))
    loads.append(os.getloadavg()[0])
  return times, loads


def critical_kernel_ms(step: Any) -> dict[str, Any]:
  """Measured kernel time (each compiled alone) summed over the schedule's
  actions per device: the busiest device's sum is the floor of a step."""
  built = step.built
  prof = built.profile
  if prof is None:
    return {}
  per = np.zeros(built.layout.num_devices)
  for a in built.unrolled.actions:
    k = prof.kernels.get(a.block)
    if k is None:
      continue
    for d in k.devices:
      per[d] += k.seconds
  return {"per_device_ms": [round(1e3 * x, 2) for x in per],
          "critical_ms": round(1e3 * float(per.max()), 2),
          "predicted_step_ms": built.report.predicted_step_ms
          if built.report is not None else None}


def tick_bound_ms(ticks: Any, num_devices: int,
                  kernel_s: Mapping[int, float]) -> dict[str, Any]:
  """Kernel time along the ticks, from each kernel's in-program time.

  ``kernel_s``: kernel id -> seconds its code ran in one traced step,
  summed over its calls (``step_profile.kernel_seconds``). Each call is
  charged the mean. A device's sum is the floor of a step if the devices
  ran independently; ``lockstep_ms`` (the sum over ticks of the slowest
  device's kernel) is the floor when every tick ends in a rendezvous
  (a ``ppermute`` both devices enter), which XLA's CPU collectives are.

  Args:
    ticks: The plan's ticks (``.kernels``: kernel id or None per device).
    num_devices: Devices of the pipe axis.
    kernel_s: In-program seconds per kernel id.
  """
  calls = collections.Counter(k for t in ticks for k in t.kernels
                              if k is not None)
  per_call = {k: kernel_s.get(k, 0.0) / c for k, c in calls.items()}
  per_dev = np.zeros(num_devices)
  lockstep = 0.0
  for t in ticks:
    ms = [per_call[k] if k is not None else 0.0 for k in t.kernels]
    per_dev += ms
    lockstep += max(ms)
  return {"in_program_kernel_ms_by_device": [round(1e3 * x, 1)
                                             for x in per_dev],
          "in_program_busiest_ms": round(1e3 * float(per_dev.max()), 1),
          "lockstep_ms": round(1e3 * lockstep, 1)}


def in_program_bound(step: Any, run: Callable[[], Any], hlo_text: str
                     ) -> dict[str, Any]:
  """The placed step's floors (``lowering_bench_floors.floors``), kernels
  from one trace."""
  jax.block_until_ready(run())
  events, _ = step_profile.trace_events(run)
  plan = step.built.plan
  return {**lowering_bench_floors.floors(
      plan, step_profile.kernel_seconds(events, hlo_text)),
          **lowering_bench_floors.inclusive_floors(
              plan, lowering_bench_floors.kernel_parts(events, hlo_text))}


def kernel_ms_by_thread(run: Callable[[], Any], hlo_text: str
                        ) -> list[float]:
  """Kernel self time (ms) of one traced step per runtime thread, largest
  first (``step_profile``'s ``kernels`` part, split by thread instead of
  summed): with one single-threaded device per core the first is the
  busiest device's kernels."""
  parts = step_profile.instruction_parts(hlo_text)
  jax.block_until_ready(run())
  with tempfile.TemporaryDirectory() as tmp:
    jax.profiler.start_trace(tmp)
    jax.block_until_ready(run())
    jax.profiler.stop_trace()
    path = sorted(glob.glob(f"{tmp}/**/*.trace.json.gz", recursive=True))
    with gzip.open(path[-1]) as f:
      trace = json.load(f)
  events = trace["traceEvents"] if isinstance(trace, dict) else trace
  by_tid: dict[Any, list] = {}
  for e in events:
    if e.get("ph") == "X" and e.get("name") in parts:
      by_tid.setdefault(e.get("tid"), []).append(e)
  out = [1e3 * step_profile.self_times(evs, parts)["kernels"]
         for evs in by_tid.values()]
  return sorted((round(x, 1) for x in out if x > 0), reverse=True)


def worker(models: tuple[str, ...], n: int, rounds: int,
           cost: str = "uniform") -> None:
  """Every variant of every model, interleaved; prints one JSON line each."""
  mesh = jax.make_mesh((2,), ("pipe",),
                       axis_types=(jax.sharding.AxisType.Auto,))
  for name in models:
    fn, params, batch = model(name, n)
    make = lambda switches=None: tj.schedule(  # pylint: disable=cell-var-from-loop
        fn, mesh=mesh, placement=placements.vshape(2), num_microbatches=n,
        cut="markers", cost=cost, param_layout=LAYOUTS[name],
        switches=switches)
    step = make()
    t0 = time.perf_counter()
    tree_c = step.lower(params, batch).compile()
    build_s = time.perf_counter() - t0
    placed = step.place(params, batch)
    placed_c = step.lower(placed, batch).compile()
    dev0 = jax.devices()[0]
    p0, b0 = jax.device_put((params, batch), dev0)
    plain = jax.jit(jax.value_and_grad(_mean_loss(fn, b0, n))).lower(
        p0).compile()
    runs: dict[str, Callable[[], Any]] = {
        "plain_dev0": lambda: plain(p0),
        "tessel_tree": lambda: tree_c(params, batch),
        "tessel_placed": lambda: placed_c(placed, batch)}
    state = _train_state(step, params, batch)
    if state is not None:
      runs["train_step"] = state
    runs["placed_nohoist"], nohoist_c = _nohoist(make, params, batch)
    ticks_step = make(Switches(tick_order=True))
    ticks_placed = ticks_step.place(params, batch)
    ticks_c = ticks_step.lower(ticks_placed, batch).compile()
    runs["placed_ticks"] = lambda: ticks_c(ticks_placed, batch)
    ws_step = make(Switches(workspace=True))
    ws_placed = ws_step.place(params, batch)
    runs["placed_workspace"] = lambda: ws_step(ws_placed, batch)
    _check(step, runs, fn, params, batch, n)
    _same_grads(step, runs["tessel_placed"], ticks_step, runs["placed_ticks"])
    _same_grads(step, runs["tessel_placed"], ws_step,
                runs["placed_workspace"])
    for f in runs.values():
      jax.block_until_ready(f())
    times, loads = shuffled_rounds(runs, rounds)
    row = {"model": name, "param_layout": LAYOUTS[name],
           "param_bytes_per_device": list(
               step.built.layout.bytes_per_device()),
           "params": int(sum(
        x.size for x in jax.tree_util.tree_leaves(params))), "n": n,
           "rounds": rounds, "build_and_compile_s": round(build_s, 1),
           "lowered_as": step.built.plan.loop_summary(),
           "load_average": [round(min(loads), 1), round(max(loads), 1)],
           **critical_kernel_ms(step), **_paired(times)}
    for k, ts in times.items():
      walls = sorted(t[0] for t in ts)
      cpus = sorted(t[1] for t in ts)
      sys_s = sorted(t[2] for t in ts)
      faults = sorted(t[3] for t in ts)
      row[k] = {"wall_ms": round(1e3 * walls[len(walls) // 2], 1),
                "wall_min_ms": round(1e3 * walls[0], 1),
                "cpu_ms": round(1e3 * cpus[len(cpus) // 2], 1),
                "sys_ms": round(1e3 * sys_s[len(sys_s) // 2], 1),
                "minor_faults": faults[len(faults) // 2]}
    row["glibc_tunables"] = os.environ.get("GLIBC_TUNABLES", "")
    row["temp_mb"] = round(
        placed_c.memory_analysis().temp_size_in_bytes / 1e6, 1)
    row["kernel_ms_by_thread"] = kernel_ms_by_thread(runs["tessel_placed"],
                                                     placed_c.as_text())
    row.update(in_program_bound(step, runs["tessel_placed"],
                                placed_c.as_text()))
    row["placed_ticks_bound"] = in_program_bound(
        ticks_step, runs["placed_ticks"], ticks_c.as_text())
    row["placed_ticks_lowered_as"] = ticks_step.built.plan.loop_summary()
    row["profile"] = {
        "tessel_tree": step_profile.profile_step(
            runs["tessel_tree"], tree_c.as_text(), 2, 3),
        "tessel_placed": step_profile.profile_step(
            runs["tessel_placed"], placed_c.as_text(), 2, 3),
        "placed_nohoist": step_profile.profile_step(
            runs["placed_nohoist"], nohoist_c.as_text(), 2, 3)}
    print(json.dumps({"placed": row}), flush=True)


def _nohoist(make: Callable[[Switches], Any], params: Any, batch: Any
             ) -> tuple[Callable[[], Any], Any]:
  """The placed step lowered without hoisting the kernels' parameter-only
  work (``Switches(hoist=False)``): ``(run, compiled)``."""
  step = make(Switches(hoist=False))
  placed = step.place(params, batch)
  compiled = step.lower(placed, batch).compile()
  return (lambda: compiled(placed, batch)), compiled


def _paired(times: dict[str, list]) -> dict[str, Any]:
  """Median per-round ratios (wall, CPU) placed / placed without hoisting,
  placed with compacted ticks / placed and placed with a workspace
  (``Switches(workspace=True)``) / placed: each ran in every round, in
  shuffled order."""
  out = {}
  for name, (a, b) in {
      "hoisted_over_plain": (times["tessel_placed"], times["placed_nohoist"]),
      "ticks_over_placed": (times["placed_ticks"], times["tessel_placed"]),
      "workspace_over_placed": (times["placed_workspace"],
                                times["tessel_placed"]),
  }.items():
    wall = sorted(x[0] / y[0] for x, y in zip(a, b))
    cpu = sorted(x[1] / max(y[1], 1e-9) for x, y in zip(a, b))
    out[f"{name}_wall"] = round(wall[len(wall) // 2], 3)
    out[f"{name}_cpu"] = round(cpu[len(cpu) // 2], 3)
  return out


def _train_state(step: Any, params: Any, batch: Any) -> Any:
  """A closure running ``step.train_step(optax.sgd)`` on its own placed
  copy (donated and replaced each call), or None without optax."""
  try:
    import optax  # pylint: disable=import-outside-toplevel
  except ImportError:
    return None
  opt = optax.sgd(0.0)  # lr 0: the parameters stay put across rounds
  train = step.train_step(opt)
  box = {"p": step.place(params, batch)}
  box["s"] = opt.init(box["p"])

  def run() -> Any:
    loss, box["p"], box["s"] = train(box["p"], box["s"], batch)
    return loss

  return run


def _check(step: Any, runs: dict[str, Callable[[], Any]], fn: Callable,
           params: Any, batch: Any, n: int) -> None:
  """Every variant's loss equals ``jax.value_and_grad``'s; tree and placed
  gradients equal it too (rel. 1e-4: 11M-parameter sums)."""
  want_loss, want = jax.jit(jax.value_and_grad(_mean_loss(fn, batch, n)))(
      params)
  for k, f in runs.items():
    out = f()
    loss = out[0] if isinstance(out, tuple) else out
    if abs(float(loss) - float(want_loss)) > 1e-4 * abs(float(want_loss)):
      raise AssertionError(f"{k}: loss {loss} != {want_loss}")
  _, tree_g = runs["tessel_tree"]()
  _, placed_g = runs["tessel_placed"]()
  for got in (tree_g, step.unplace(placed_g)):
    for a, b in zip(jax.tree_util.tree_leaves(got),
                    jax.tree_util.tree_leaves(want)):
      err = float(jnp.max(jnp.abs(a - b)) / (jnp.max(jnp.abs(b)) + 1e-30))
      if err > 1e-4:
        raise AssertionError(f"gradient rel. error {err}")


def _same_grads(step: Any, run: Callable[[], Any], other_step: Any,
                other_run: Callable[[], Any]) -> None:
  """Two placed programs of one model give the same gradients."""
  got = other_step.unplace(other_run()[1])
  want = step.unplace(run()[1])
  for a, b in zip(jax.tree_util.tree_leaves(got),
                  jax.tree_util.tree_leaves(want)):
    err = float(jnp.max(jnp.abs(a - b)) / (jnp.max(jnp.abs(b)) + 1e-30))
    if err > 1e-5:
      raise AssertionError(f"placed variant: gradient rel. error {err}")


def plain_worker(models: tuple[str, ...], n: int, rounds: int) -> None:
  """Plain jit on one device in this process (its cores set from outside)."""
  for name in models:
    fn, params, batch = model(name, n)
    run = jax.jit(jax.value_and_grad(_mean_loss(fn, batch, n))).lower(
        params).compile()
    jax.block_until_ready(run(params))
    ts = [_timed(lambda: run(params)) for _ in range(rounds)]
    walls = sorted(t[0] for t in ts)
    cpus = sorted(t[1] for t in ts)
    print(json.dumps({"plain": {
        "model": name, "wall_ms": round(1e3 * walls[len(walls) // 2], 1),
        "wall_min_ms": round(1e3 * walls[0], 1),
        "cpu_ms": round(1e3 * cpus[len(cpus) // 2], 1),
        "load_average": round(os.getloadavg()[0], 1)}}), flush=True)


def _spawn(worker_name: str, cores: list[int], args: Any) -> list[dict]:
  cmd = [sys.executable, "-m", "experiments.lowering_bench",
         f"--worker={worker_name}",
         f"--placed_models={','.join(args.placed_models)}",
         f"--placed_n={args.placed_n}", f"--repeats={args.repeats}",
         f"--placed_cost={args.placed_cost}",
         "--output="]
  env = host_pages.env(args.keep_pages)
  env.pop("XLA_FLAGS", None)
  taskset = shutil.which("taskset")
  if taskset:
    cmd = [taskset, "-c", ",".join(map(str, cores)), *cmd]
  proc = subprocess.run(cmd, capture_output=True, text=True, env=env,
                        check=False)
  rows = [json.loads(l) for l in proc.stdout.splitlines()
          if l.startswith("{")]
  if proc.returncode or not rows:
    raise RuntimeError(f"{worker_name} worker failed:\n{proc.stderr[-3000:]}")
  return rows


def part_placed(args: Any, log: Callable[[str], None]) -> dict[str, Any]:
  """The three workers; a markdown table of their figures."""
  cores = sorted(os.sched_getaffinity(0))[:2]
  rows = [r["placed"] for r in _spawn("placed", cores, args)]
  plain1 = {r["plain"]["model"]: r["plain"]
            for r in _spawn("plain1", cores[:1], args)}
  plain2 = {r["plain"]["model"]: r["plain"]
            for r in _spawn("plain2", cores, args)}
  for r in rows:
    r["plain_1core"] = plain1[r["model"]]
    r["plain_2core"] = plain2[r["model"]]
    log(f"placed {r}")
  table = markdown(rows)
  log(table)
  return {"rows": rows, "table": table, "cores": cores,
          "load_average": os.getloadavg()}


def markdown(rows: list[dict[str, Any]]) -> str:
  """One line per model: median wall ms (process CPU ms) of every variant."""
  head = ["model", "params", "plain jit 1 core (own process)",
          "plain jit 2 cores (own process)", "plain jit dev0 (interleaved)",
          "tessel tree", "tessel placed", "placed, no hoist",
          "placed / no hoist (paired wall, CPU)",
          "train_step (fused, donated)",
          "kernels, busiest thread (trace)", "kernels alone, busiest device",
          "placed / kernels", "kernels in program, busiest device",
          "lockstep floor (ticks' slowest kernels)",
          "sync floor (slowest device between rendezvous)",
          "placed / busiest device, / lockstep, / sync floor", "placed sys ms, faults",
          "compacted ticks (tick_order)", "compacted / placed (paired wall,"
          " CPU)", "compacted's lockstep floor",
          "placed, workspace", "workspace / placed (paired wall, CPU)",
          "workspace sys ms, faults",
          "tree pack/unpack ms", "placed pack/unpack ms", "load"]
  lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
  for r in rows:
    def cell(v: Any) -> str:
      return "-" if v is None else f"{v['wall_ms']:.0f} ({v['cpu_ms']:.0f})"
    thread = (r.get("kernel_ms_by_thread") or [None])[0]
    alone = r.get("critical_ms")
    ratio = (f"{r['tessel_placed']['wall_ms'] / thread:.2f}x" if thread
             else "-")
    lines.append("| " + " | ".join([
        r["model"], f"{r['params'] / 1e6:.1f}M", cell(r["plain_1core"]),
        cell(r["plain_2core"]), cell(r["plain_dev0"]),
        cell(r["tessel_tree"]), cell(r["tessel_placed"]),
        cell(r.get("placed_nohoist")),
        f"{r.get('hoisted_over_plain_wall', '-')},"
        f" {r.get('hoisted_over_plain_cpu', '-')}",
        cell(r.get("train_step")), f"{thread:.0f}" if thread else "-",
        f"{alone:.0f}" if alone else "-", ratio, *_bound_cells(r),
        cell(r.get("placed_ticks")),
        f"{r.get('ticks_over_placed_wall', '-')},"
        f" {r.get('ticks_over_placed_cpu', '-')}",
        str(r.get("placed_ticks_bound", {}).get("lockstep_ms", "-")),
        *_workspace_cells(r),
        f"{r['profile']['tessel_tree']['pack/unpack']:.0f}",
        f"{r['profile']['tessel_placed']['pack/unpack']:.0f}",
        f"{r['load_average'][0]}-{r['load_average'][1]}"]) + " |")
  return "\n".join(lines)


def _workspace_cells(r: dict[str, Any]) -> list[str]:
  """The placed step with a workspace (``Switches(workspace=True)``)."""
  ws = r.get("placed_workspace")
  if ws is None:
    return ["-", "-", "-"]
  return [f"{ws['wall_ms']:.0f} ({ws['cpu_ms']:.0f})",
          f"{r.get('workspace_over_placed_wall', '-')},"
          f" {r.get('workspace_over_placed_cpu', '-')}",
          f"{ws['sys_ms']:.0f}, {ws['minor_faults']}"]


def _bound_cells(r: dict[str, Any]) -> list[str]:
  """The in-program kernel floors and the placed step against them."""
  busiest, lock = r.get("in_program_busiest_ms"), r.get("lockstep_ms")
  sync = r.get("sync_floor_ms")
  wall = r["tessel_placed"]["wall_ms"]
  placed = r["tessel_placed"]
  return [f"{busiest:.0f}" if busiest else "-",
          f"{lock:.0f}" if lock else "-",
          f"{sync:.0f} ({r.get('rendezvous', '-')} rendezvous)" if sync
          else "-",
          f"{wall / busiest:.2f}x, {wall / lock:.2f}x, {wall / sync:.2f}x"
          if busiest and lock and sync else "-",
          f"{placed.get('sys_ms', '-')}, {placed.get('minor_faults', '-')}"]
