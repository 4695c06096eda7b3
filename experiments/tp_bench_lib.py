"""The pipeline x tensor x data benchmark (no flags here); see
``experiments.tp_bench``."""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import AxisType, NamedSharding
from jax.sharding import PartitionSpec as P

import tessel_jax as tj
from experiments import hlo_count, step_profile
from experiments import realtime as realtime_
from experiments import rel_err
from tessel_jax import placements

try:  # installed: passes/ is tessel_jax.passes
  from tessel_jax.passes import program_bytes  # type: ignore
except ImportError:  # run from the repository root
  from passes import program_bytes  # type: ignore

# name -> (mesh axes and sizes, pipelined?, data_axes, weights split?);
# split ``"fsdp"``: the Megatron specs with ``model`` read as ``data``
# (every weight split over the data axis: gathered per step, or per block
# in the ``PER_BLOCK`` configs).
CONFIGS: dict[str, tuple[dict[str, int], bool, tuple[str, ...],
                         bool | str]] = {
    "pipe4": ({"pipe": 4}, True, (), False),
    "pipe2_model2": ({"pipe": 2, "model": 2}, True, (), True),
    "pipe2_model2_replicated": ({"pipe": 2, "model": 2}, True, (), False),
    "pipe2_data2": ({"pipe": 2, "data": 2}, True, ("data",), False),
    "pipe2_data2_fsdp": ({"pipe": 2, "data": 2}, True, ("data",), "fsdp"),
    "pipe2_data2_model2": ({"pipe": 2, "data": 2, "model": 2}, True,
                           ("data",), True),
    "model4": ({"model": 4}, False, (), True),
    # The same programs with every ramp unrolled (no interpreted ramps).
    "pipe2_model2_unrolled": ({"pipe": 2, "model": 2}, True, (), True),
    "pipe2_data2_model2_unrolled": ({"pipe": 2, "data": 2, "model": 2}, True,
                                    ("data",), True),
    "data4": ({"data": 4}, False, ("data",), False),
    # ZeRO-3 per block (``fsdp="per_block"``), and both FSDP modes on the
    # interleaved placement with ``layers // 2`` chunks (one layer per
    # block, several blocks per device).
    "pipe2_data2_fsdp_block": ({"pipe": 2, "data": 2}, True, ("data",),
                               "fsdp"),
    "pipe2_data2_fsdp_il": ({"pipe": 2, "data": 2}, True, ("data",), "fsdp"),
    "pipe2_data2_fsdp_il_block": ({"pipe": 2, "data": 2}, True, ("data",),
                                  "fsdp"),
}
# Configs gathering FSDP weights per block, and on the interleaved placement.
PER_BLOCK = ("pipe2_data2_fsdp_block", "pipe2_data2_fsdp_il_block")
INTERLEAVED = ("pipe2_data2_fsdp_il", "pipe2_data2_fsdp_il_block")


class BenchArgs(NamedTuple):
  """Everything ``tp_bench_lib`` needs; see the flags for meanings."""

  configs: tuple[str, ...] = tuple(CONFIGS)
  hidden: int = 256
  layers: int = 4
  vocab: int = 256
  rows: int = 16
  seq: int = 4
  microbatches: int = 4
  repeats: int = 7
  interpret_ramps: int | None = 8
  cost: str = "measured"
  output: str | None = "out/tp_bench.json"
  realtime: bool = False
  kernel_spans: bool = False
  fsdp: str | None = None  # tj.schedule's fsdp (None: per the config name)


# --- the model: the README's GPT with Megatron MLP layers --------------------


def gpt(args: BenchArgs) -> tuple[Any, Any, Callable[[int], Any]]:
  """``(params, specs, make_fn)``: a tied-embedding GPT whose layers are
  ``h + gelu(h @ up) @ down`` (``up`` split over ``model`` by columns,
  ``down`` by rows); ``make_fn(blocks)`` cuts it into ``blocks`` blocks."""
  h, f = args.hidden, 4 * args.hidden
  keys = jax.random.split(jax.random.key(0), 2 * args.layers + 1)
  params = {"wte": jax.random.normal(keys[0], (args.vocab, h)) * 0.1,
            "layers": [{"up": jax.random.normal(keys[2 * i + 1], (h, f))
                               / np.sqrt(h),
                        "down": jax.random.normal(keys[2 * i + 2], (f, h))
                                / np.sqrt(f)}
                       for i in range(args.layers)]}
  specs = {"wte": P(), "layers": [{"up": P(None, "model"),
                                   "down": P("model", None)}] * args.layers}

  def make_fn(blocks: int) -> Callable[[Any, Any], Any]:
    per = args.layers // blocks

    def loss_fn(params: Any, batch: Any) -> Any:
      x = params["wte"][batch["tokens"]]
      for i, lp in enumerate(params["layers"]):
        x = x + jax.nn.gelu(x @ lp["up"]) @ lp["down"]
        if (i + 1) % per == 0 and i + 1 < args.layers:
          x = tj.boundary(x)
      logp = jax.nn.log_softmax(x @ params["wte"].T)
      return -jnp.take_along_axis(logp, batch["labels"][..., None],
                                  -1).mean()

    return loss_fn

  return params, specs, make_fn


def make_batch(args: BenchArgs) -> dict[str, Any]:
  k1, k2 = jax.random.split(jax.random.key(1))
  shape = (args.rows, args.seq)
  return {"tokens": jax.random.randint(k1, shape, 0, args.vocab),
          "labels": jax.random.randint(k2, shape, 0, args.vocab)}


# --- one configuration -------------------------------------------------------


def _mesh(shape: dict[str, int]) -> Any:
  n = int(np.prod(list(shape.values())))
  return jax.make_mesh(tuple(shape.values()), tuple(shape),
                       axis_types=(AxisType.Auto,) * len(shape),
                       devices=jax.devices()[:n])


def _place(tree: Any, specs: Any, mesh: Any) -> Any:
  return jax.tree_util.tree_map(
      lambda x, s: jax.device_put(x, NamedSharding(mesh, s)), tree, specs,
      is_leaf=lambda x: isinstance(x, P))


def interleaved_times(runs: dict[str, Callable[[], Any]], rounds: int,
                      seed: int = 0) -> dict[str, dict[str, float]]:
  """Wall and process-CPU seconds of each run, alternated: every round
  runs each once in a shuffled order (a busy neighbour slows all alike).

  Returns:
    name -> ``{"median_s", "min_s", "cpu_s"}`` (``cpu_s``: median
    process CPU seconds of one run).
  """
  rng = np.random.default_rng(seed)
  for fn in runs.values():
    jax.block_until_ready(fn())
  wall: dict[str, list[float]] = {n: [] for n in runs}
  cpu: dict[str, list[float]] = {n: [] for n in runs}
  names = list(runs)
  for _ in range(rounds):
    for n in rng.permutation(names):
      c0, t0 = time.process_time(), time.perf_counter()
      jax.block_until_ready(runs[n]())
      wall[n].append(time.perf_counter() - t0)
      cpu[n].append(time.process_time() - c0)
  return {n: {"median_s": float(np.median(wall[n])),
              "min_s": float(np.min(wall[n])),
              "cpu_s": float(np.median(cpu[n]))} for n in names}


def _program(name: str, args: BenchArgs, params: Any, specs: Any,
             make_fn: Callable[[int], Any], batch: Any
             ) -> tuple[Any, Any, Any, Any]:
  """``(jitted or step, params, batch, step or None)`` of one config."""
  shape, piped, data, split = CONFIGS[name]
  mesh = _mesh(shape)
  use = jax.tree_util.tree_map(
      lambda s: P(*(("data" if e == "model" else e) for e in s))
      if split == "fsdp" else s if split else P(), specs,
      is_leaf=lambda x: isinstance(x, P))
  placed = _place(params, use, mesh)
  if piped:
    d = shape["pipe"]
    chunks = args.layers // d if name in INTERLEAVED else 1
    graph = (placements.interleaved(d, mode="train", chunks=chunks)
             if chunks > 1 else placements.vshape(d, mode="train"))
    step = tj.schedule(make_fn(d * chunks), mesh=mesh, placement=graph,
                       num_microbatches=args.microbatches,
                       plan="interleaved" if chunks > 1 else "1f1b",
                       data_axes=data, cost=args.cost,
                       interpret_ramps=(None if name.endswith("_unrolled")
                                        else args.interpret_ramps),
                       fsdp=args.fsdp or ("per_block" if name in PER_BLOCK
                                          else "per_step"))
    return step, placed, batch, step
  fn = make_fn(1)
  batch_spec = P(data) if data else P()
  placed_batch = jax.tree_util.tree_map(
      lambda x: jax.device_put(x, NamedSharding(mesh, batch_spec)), batch)
  return jax.jit(jax.value_and_grad(fn)), placed, placed_batch, None


def measure(name: str, args: BenchArgs, model: Any, batch: Any,
            reference: Any) -> tuple[dict[str, Any], Callable[[], Any]]:
  """Compiled bytes per device and (pipelines) the prediction, and a
  function running one step (timed later, interleaved with the others)."""
  params, specs, make_fn = model
  prog, placed, placed_batch, step = _program(name, args, params, specs,
                                              make_fn, batch)
  t0 = time.perf_counter()
  compiled = prog.lower(placed, placed_batch).compile()
  compile_s = time.perf_counter() - t0
  out = compiled(placed, placed_batch)
  err = rel_err.max_rel(out, reference)
  mem = compiled.memory_analysis()
  measured = {"argument": int(mem.argument_size_in_bytes),
              "output": int(mem.output_size_in_bytes),
              "temp": int(mem.temp_size_in_bytes)}
  total = sum(measured.values())
  rec = {"mesh": CONFIGS[name][0], "pipelined": CONFIGS[name][1],
         "weights_split": CONFIGS[name][3],
         "compile_s": compile_s, "max_rel_err_vs_value_and_grad": err,
         "bytes_per_device": measured, "total_bytes_per_device": total}
  if step is not None:
    # Weight-sized instructions by where they run (inside switch branches:
    # per tick on the devices taking them).
    shapes = {tuple(x.sharding.shard_shape(x.shape))
              for x in jax.tree_util.tree_leaves(placed)
              if x.ndim == 2} | {tuple(x.shape) for x in
                                  jax.tree_util.tree_leaves(placed)
                                  if x.ndim == 2}
    rec["weight_sized_ops"] = hlo_count.param_ops(compiled.as_text(),
                                                  sorted(shapes))
    rec.update(_prediction(step, args))
    rec["predicted_over_measured"] = rec["predicted_bytes_per_device"] / total
    r = step.report
    rec["predicted_step_ms"] = r.predicted_step_ms
    rec["predicted_block_ms"] = r.block_ms
    rec["predicted_tick_overhead_ms"] = r.tick_overhead_ms
    rec["predicted_fsdp_collective_ms"] = r.fsdp_collective_ms
    rec["predicted_outside_ms"] = r.outside_ms
    rec["ticks"] = r.ticks
    rec["plan"] = step.built.plan.loop_summary()
    rec["lowering"] = r.lowering
    if args.kernel_spans:
      shape, _, data, _ = CONFIGS[name]
      replicas = int(np.prod([shape[a] for a in data]))
      rec["kernel_spans"] = kernel_spans(
          step, lambda: compiled(placed, placed_batch), compiled.as_text(),
          replicas)
  return rec, lambda: compiled(placed, placed_batch)


def kernel_spans(step: Any, run: Callable[[], Any], hlo_text: str,
                 replicas: int, repeats: int = 3) -> dict[str, Any]:
  """Each kernel's profiled core-milliseconds per run against what its own
  instructions took in the program (XLA's trace split by the lowering's
  ``tj_kernel/k<id>`` scopes, all device threads, median of ``repeats``
  traced steps, over its runs: micro-batches x data ``replicas``)."""
  prof = step.built.profile
  runs: dict[int, int] = {}
  for a in step.built.unrolled.actions:
    runs[a.block] = runs.get(a.block, 0) + replicas
  jax.block_until_ready(run())
  got: dict[int, list[float]] = {b: [] for b in prof.kernels}
  for _ in range(repeats):
    secs = step_profile.kernel_seconds(step_profile.trace_events(run)[0],
                                       hlo_text)
    for b in got:
      got[b].append(secs.get(b, 0.0))
  out = {}
  for b, k in sorted(prof.kernels.items()):
    program = 1e3 * float(np.median(got[b])) / max(1, runs.get(b, 1))
    out[k.label] = {"profile_ms": 1e3 * k.core_seconds,
                    "program_ms": program,
                    "program_over_profile": program / max(
                        1e-12, 1e3 * k.core_seconds)}
  return out


def _prediction(step: Any, args: BenchArgs) -> dict[str, Any]:
  """Predicted bytes per device (``passes.program_bytes``): the arguments
  and outputs (parameters and gradients as placed, the batch) plus the
  larger of the loop (packed parameters, accumulators, stash) and the
  unpack (packed gradients gathered over the pipe axis)."""
  built = step.built
  pred = program_bytes.predict(
      built.layout, built.plan, built.partition.traced.param_avals,
      batch_bytes=2 * args.rows * args.seq * 4,
      stash_peak_bytes=max(step.report.stash_peak_bytes))
  return {"predicted_bytes_per_device": pred.total,
          "predicted_parts": pred.to_dict(),
          "schedule_makespan": built.unrolled.makespan}



def main(args: BenchArgs) -> int:
  if args.realtime:  # before jax starts its threads: they inherit it
    realtime_.realtime_process()
  model = gpt(args)
  batch = make_batch(args)
  reference = jax.jit(jax.value_and_grad(model[2](1)))(model[0], batch)
  record: dict[str, Any] = {"jax": jax.__version__, "args": args._asdict(),
                            "realtime": realtime_.realtime_now(),
                            "configs": {}}
  runs = {}
  for name in args.configs:
    record["configs"][name], runs[name] = measure(name, args, model, batch,
                                                  reference)
  load0 = os.getloadavg()[0]
  times = interleaved_times(runs, args.repeats)
  record["load_average"] = [load0, os.getloadavg()[0]]
  for name in args.configs:
    rec = record["configs"][name]
    rec["step_ms"] = 1e3 * times[name]["median_s"]
    rec["step_ms_min"] = 1e3 * times[name]["min_s"]
    rec["cpu_ms_per_step"] = 1e3 * times[name]["cpu_s"]
    pms = rec.get("predicted_step_ms")
    if pms is not None:
      rec["predicted_over_measured_step"] = pms / rec["step_ms"]
    pred = rec.get("predicted_bytes_per_device")
    spans = rec.get("kernel_spans")
    if spans:
      print(f"{name}: kernel ms per run, profiled -> in the program: "
            + ", ".join(f"{l} {v['profile_ms']:.2f}->{v['program_ms']:.2f}"
                        for l, v in spans.items()))
    print(f"{name:27s} step {rec['step_ms']:7.2f} ms (min"
          f" {rec['step_ms_min']:6.2f}, CPU {rec['cpu_ms_per_step']:6.1f})"
          + (f" predicted {pms:6.2f} ({pms / rec['step_ms']:.2f}x)"
             if pms else "") + "  bytes/device"
          f" {rec['total_bytes_per_device'] / 2**20:7.2f} MiB"
          + (f"  predicted {pred / 2**20:7.2f} MiB"
             f" ({rec['predicted_over_measured']:.2f}x)" if pred else "")
          + f"  err {rec['max_rel_err_vs_value_and_grad']:.1e}", flush=True)
  print(f"load average {record['load_average'][0]:.1f} before timing,"
        f" {record['load_average'][1]:.1f} after; {args.repeats} interleaved"
        f" rounds" + (" at real-time priority" if record["realtime"]
                      else ""))
  configs = record["configs"]
  if {"pipe2_model2", "pipe2_model2_replicated"} <= set(configs):
    ratio = (configs["pipe2_model2"]["total_bytes_per_device"] /
             configs["pipe2_model2_replicated"]["total_bytes_per_device"])
    record["model2_over_replicated_bytes"] = ratio
    print(f"pipe2_model2 / pipe2_model2_replicated bytes per device:"
          f" {ratio:.2f}x (target <= 0.6x)")
  if args.output:
    os.makedirs(os.path.dirname(args.output) or ".", exist_ok=True)
    with open(args.output, "w") as f:
      json.dump(record, f, indent=1)
    print(f"results: {args.output}")
  return 0
