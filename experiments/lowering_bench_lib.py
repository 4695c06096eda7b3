"""The lowering benchmark (no flags here); see ``experiments.lowering_bench``."""

from __future__ import annotations

import json
import os
import re
import resource
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

import tessel_jax as tj
from tessel_jax import placements

PARTS = ("compile", "memory", "speedup", "profile", "placed")
DEFAULT_PARTS = ("compile", "memory", "speedup")


class BenchArgs(NamedTuple):
  """Everything ``lowering_bench_lib`` needs; see the flags for meanings."""

  parts: tuple[str, ...] = DEFAULT_PARTS
  compile_n: tuple[int, ...] = (8, 32, 128, 256)
  placement: str = "vshape"
  devices: int = 4
  speed_hidden: int = 1024
  speed_layers: int = 4
  speed_rows: int = 512
  speed_n: int = 16
  speed_cut: str = "auto"
  repeats: int = 5
  output: str | None = "out/lowering_bench.json"
  worker: str | None = None
  profile_models: tuple[str, ...] = ("mlp", "gpt", "wide")
  profile_plans: tuple[str, ...] = ("searched", "gpipe", "1f1b")
  profile_n: int = 8
  profile_cost: str = "measured"
  placed_models: tuple[str, ...] = ("wide", "resnet18")
  placed_n: int = 8
  placed_cost: str = "uniform"
  keep_pages: bool = False


# --- models -----------------------------------------------------------------


def chain_model(num_blocks: int, hidden: int, layers_per_block: int = 1,
                seed: int = 0) -> tuple[Callable[..., Any], Any]:
  """An MLP of ``num_blocks`` blocks with a boundary between blocks."""
  n = num_blocks * layers_per_block
  keys = jax.random.split(jax.random.PRNGKey(seed), n)
  params = [{"w": jax.random.normal(k, (hidden, hidden)) / np.sqrt(hidden),
             "b": jnp.zeros((hidden,))} for k in keys]

  def mlp_loss(p, batch):
    h = batch["x"]
    for i, layer in enumerate(p):
      h = jnp.tanh(h @ layer["w"] + layer["b"])
      if (i + 1) % layers_per_block == 0 and i + 1 < n:
        h = tj.boundary(h)
    return jnp.mean((h - batch["y"]) ** 2)

  return mlp_loss, params


def make_batch(rows: int, hidden: int, seed: int = 1) -> dict[str, Any]:
  kx, ky = jax.random.split(jax.random.PRNGKey(seed))
  return {"x": jax.random.normal(kx, (rows, hidden)),
          "y": jax.random.normal(ky, (rows, hidden))}


def _median_run(fn: Callable[[], Any], repeats: int) -> tuple[float, float]:
  """Median wall seconds over ``repeats`` runs and the CPU seconds of that run.

  One warm-up run first; the machine is shared, so medians, not minima.
  """
  jax.block_until_ready(fn())
  runs = []
  for _ in range(repeats):
    r0 = resource.getrusage(resource.RUSAGE_SELF)
    t0 = time.perf_counter()
    jax.block_until_ready(fn())
    wall = time.perf_counter() - t0
    r1 = resource.getrusage(resource.RUSAGE_SELF)
    runs.append((wall, (r1.ru_utime - r0.ru_utime) +
                 (r1.ru_stime - r0.ru_stime)))
  runs.sort()
  return runs[len(runs) // 2]


# --- HLO inspection ---------------------------------------------------------


def _computations(text: str) -> dict[str, list[str]]:
  comps: dict[str, list[str]] = {}
  cur = None
  for line in text.split("\n"):
    m = re.match(r"^(?:ENTRY )?%(\S+) ", line)
    if m and line.rstrip().endswith("{"):
      cur = m.group(1)
      comps[cur] = []
    elif cur is not None:
      comps[cur].append(line)
  return comps


def loop_copies(text: str, shapes: Sequence[tuple[int, ...]]) -> dict[str, int]:
  """Copies of buffers with one of ``shapes`` inside while-loop bodies.

  Follows computations called from the body (conditional branches, nested
  calls). Returns ``{"stash_sized": n, "all": m}`` per loop iteration
  (summed over the loops of the program).
  """
  comps = _computations(text)
  bodies = re.findall(r"body=%([^,\s]+)", text)
  wanted = {",".join(str(d) for d in s) for s in shapes}
  stash, total = 0, 0
  for body in bodies:
    seen, stack = set(), [body]
    while stack:
      name = stack.pop()
      if name in seen or name not in comps:
        continue
      seen.add(name)
      for line in comps[name]:
        m = re.search(r"= \w+\[([0-9,]*)\]\S* copy\(", line)
        if m:
          total += 1
          if m.group(1) in wanted:
            stash += 1
        for callee in re.findall(
            r"(?:branch_computations=\{|to_apply=|calls=|body=|condition=)"
            r"%?([^,\s}]+)", line):
          if "fused" not in callee and "wrapped" not in callee:
            stack.append(callee.lstrip("%"))
        m = re.search(r"branch_computations=\{([^}]*)\}", line)
        if m:
          stack.extend(x.strip().lstrip("%") for x in m.group(1).split(","))
  return {"stash_sized": stash, "all": total}


# --- parts ------------------------------------------------------------------


def part_compile(args: Any, log: Callable[[str], None]) -> dict[str, Any]:
  graph = placements.get(args.placement, args.devices)
  nb = sum(1 for b in graph.blocks if b.kind == "F")
  fn, params = chain_model(nb, 64)
  mesh = jax.make_mesh((args.devices,), ("pipe",))
  rows = []
  # Warm up JAX/XLA once so the first N does not pay one-time costs.
  warm = tj.schedule(fn, mesh=mesh, placement=graph, num_microbatches=4)
  warm.lower(params, make_batch(4 * 4, 64)).compile()
  for n in args.compile_n:
    batch = make_batch(n * 4, 64)
    step = tj.schedule(fn, mesh=mesh, placement=graph, num_microbatches=n)
    t0 = time.perf_counter()
    built = step.build(params, batch)
    build_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    lowered = step.lower(params, batch)
    lower_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    compiled = lowered.compile()
    compile_s = time.perf_counter() - t0
    step_s, _ = _median_run(lambda: compiled(params, batch), args.repeats)
    row = {"n": n, "build_s": round(build_s, 3), "lower_s": round(lower_s, 3),
           "compile_s": round(compile_s, 3),
           "lower_plus_compile_s": round(lower_s + compile_s, 3),
           "step_ms": round(step_s * 1e3, 2), "ticks": len(built.plan.ticks),
           "lowered_as": built.plan.loop_summary(),
           "hlo_chars": len(compiled.as_text())}
    rows.append(row)
    log(f"compile N={n}: {row}")
  first, last = rows[0], rows[-1]
  return {"placement": graph.name, "rows": rows,
          "compile_ratio": round(last["compile_s"] / first["compile_s"], 3),
          "lower_plus_compile_ratio": round(
              last["lower_plus_compile_s"] / first["lower_plus_compile_s"], 3)}


def part_memory(args: Any, log: Callable[[str], None]) -> dict[str, Any]:
  out = []
  for name, n, hidden in ((args.placement, 32, 256), ("mshape", 32, 256)):
    graph = placements.get(name, args.devices)
    nb = sum(1 for b in graph.blocks if b.kind == "F")
    fn, params = chain_model(nb, hidden)
    rows_per_mb = 4 * args.devices
    batch = make_batch(n * rows_per_mb, hidden)
    mesh = jax.make_mesh((args.devices,), ("pipe",))
    step = tj.schedule(fn, mesh=mesh, placement=graph, num_microbatches=n)
    built = step.build(params, batch)
    compiled = step.lower(params, batch).compile()
    ma = compiled.memory_analysis()
    plan = built.plan
    shapes = [(p.slots + 1,) + p.aval.shape for p in plan.pools]
    shapes += [(built.layout.size[dt],) for dt in built.layout.dtypes]
    copies = loop_copies(compiled.as_text(), shapes)
    predicted_peak = list(built.predicted_stash_bytes())
    row = {
        "placement": graph.name, "n": n, "hidden": hidden,
        "schedule_peak_stash_bytes": predicted_peak,
        "plan_stash_bytes_allocated": plan.stash_bytes,
        "plan_stash_bytes_used": list(plan.stash_bytes_used()),
        "param_bytes_per_device": list(built.layout.bytes_per_device()),
        "memory_analysis": {
            "temp": int(ma.temp_size_in_bytes),
            "argument": int(ma.argument_size_in_bytes),
            "output": int(ma.output_size_in_bytes),
            "alias": int(ma.alias_size_in_bytes),
            "generated_code": int(ma.generated_code_size_in_bytes)},
        "loop_copies": copies,
        "lowered_as": plan.loop_summary(),
    }
    out.append(row)
    log(f"memory {graph.name}: {row}")
  return {"rows": out}


def _worker(args: Any) -> dict[str, Any]:
  """One speed-up measurement in this process (flags set by the binary)."""
  fn, params = chain_model(2, args.speed_hidden, args.speed_layers // 2)
  n = args.speed_n
  batch = make_batch(n * args.speed_rows, args.speed_hidden)
  if args.worker == "plain":
    def mean_loss(p):
      mbs = jax.tree_util.tree_map(
          lambda x: x.reshape((n, -1) + x.shape[1:]), batch)
      return jnp.mean(jax.lax.map(lambda mb: fn(p, mb), mbs))
    run = jax.jit(jax.value_and_grad(mean_loss))
    wall, cpu = _median_run(lambda: run(params), args.repeats)
    return {"wall_s": wall, "cpu_s": cpu, "devices": len(jax.devices())}
  mesh = jax.make_mesh((2,), ("pipe",))
  step = tj.schedule(fn, mesh=mesh, placement=placements.vshape(2),
                     num_microbatches=n, cut=args.speed_cut)
  compiled = step.lower(params, batch).compile()
  wall, cpu = _median_run(lambda: compiled(params, batch), args.repeats)
  u = step.unrolled
  busy = sum(b.span for b in u.graph.blocks) * n / 2
  return {"wall_s": wall, "cpu_s": cpu, "devices": len(jax.devices()),
          "makespan": u.makespan, "schedule_efficiency": busy / u.makespan,
          "lowered_as": step.built.plan.loop_summary(),
          "spans": {b.label: b.span for b in u.graph.blocks}}


def part_speedup(args: Any, log: Callable[[str], None]) -> dict[str, Any]:
  res = {}
  for worker in ("plain", "pipe"):
    cmd = [sys.executable, "-m", "experiments.lowering_bench",
           f"--worker={worker}", f"--speed_hidden={args.speed_hidden}",
           f"--speed_layers={args.speed_layers}",
           f"--speed_rows={args.speed_rows}", f"--speed_n={args.speed_n}",
           f"--speed_cut={args.speed_cut}",
           f"--repeats={args.repeats}", "--output="]
    env = dict(os.environ)
    env.pop("XLA_FLAGS", None)
    # One core per device: XLA's CPU runtime runs independent work on
    # several threads even with single-threaded Eigen (measured: the plain
    # step used 1.21 s CPU in 0.62 s wall), so pin the plain step to one core
    # and the 2-device step to two.
    # taskset pins the child from outside: a preexec_fn would make
    # subprocess fork this multi-threaded (JAX) process, which Python warns
    # about.
    cores = sorted(os.sched_getaffinity(0))[:1 if worker == "plain" else 2]
    taskset = shutil.which("taskset")
    if taskset:
      cmd = [taskset, "-c", ",".join(map(str, cores)), *cmd]
    else:
      log("taskset not found: the speed-up workers run unpinned")
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env,
                          check=False)
    lines = [l for l in proc.stdout.splitlines() if l.startswith("{")]
    if proc.returncode or not lines:
      raise RuntimeError(f"speed-up worker {worker} failed:\n{proc.stderr}")
    res[worker] = json.loads(lines[-1]) | {"cores": cores}
    log(f"speedup {worker}: {res[worker]}")
  plain, pipe = res["plain"], res["pipe"]
  out = {
      "model": {"hidden": args.speed_hidden, "layers": args.speed_layers,
                "rows_per_microbatch": args.speed_rows,
                "cut": args.speed_cut,
                "microbatches": args.speed_n},
      "plain": plain, "pipe": pipe,
      "speedup_wall": round(plain["wall_s"] / pipe["wall_s"], 3),
      # Total CPU work of the pipelined step against the plain step: the
      # lowering's overhead, independent of how many cores were free.
      "work_ratio_cpu": round(pipe["cpu_s"] / plain["cpu_s"], 3),
      # Speed-up two free cores would give: plain time over the busiest
      # device's share of the work, stretched by the schedule's bubbles.
      "speedup_if_two_free_cores": round(
          plain["cpu_s"] / (pipe["cpu_s"] / 2 / pipe["schedule_efficiency"]),
          3),
      "load_average": os.getloadavg(),
      "cpu_count": os.cpu_count(),
  }
  log(f"speedup: wall {out['speedup_wall']}x, CPU work ratio"
      f" {out['work_ratio_cpu']}, two free cores ~"
      f"{out['speedup_if_two_free_cores']}x (load {out['load_average']})")
  return out


def main(args: Any) -> int:
  # Imported here: lowering_profile imports this module.
  from experiments import lowering_profile  # pylint: disable=import-outside-toplevel
  from experiments import placed_bench  # pylint: disable=import-outside-toplevel
  if args.worker == "placed":
    placed_bench.worker(args.placed_models, args.placed_n, args.repeats,
                        args.placed_cost)
    return 0
  if args.worker in ("plain1", "plain2"):
    placed_bench.plain_worker(args.placed_models, args.placed_n, args.repeats)
    return 0
  if args.worker == "profile":
    lowering_profile.worker(args.profile_models, args.profile_plans,
                            args.profile_n, args.profile_cost, args.repeats)
    return 0
  if args.worker is not None:
    print(json.dumps(_worker(args)))
    return 0
  record: dict[str, Any] = {"jax": jax.__version__}
  log = lambda s: print(s, flush=True)
  for part in args.parts:
    record[part] = {"compile": part_compile, "memory": part_memory,
                    "speedup": part_speedup,
                    "profile": lowering_profile.part_profile,
                    "placed": placed_bench.part_placed}[part](args, log)
  text = json.dumps(record, indent=1)
  if args.output:
    os.makedirs(os.path.dirname(args.output) or ".", exist_ok=True)
    with open(args.output, "w") as f:
      f.write(text)
    print(f"results: {args.output}")
  else:
    print(text)
  return 0
