"""Inference latency and throughput per placement (no flags here).

See ``experiments.inference``. For a small GPT with a large vocabulary
(``gpt_profile``: embedding, transformer layers, tied head) scoring a batch
of ``N`` micro-batches (forward only), every placement is built with
``tj.schedule(..., mode="infer", cost="measured")`` and compared with the
V-shape:

1. the layers' forward times are measured (``gpt_profile.profile_layers``,
   one block per layer on one device, the smallest of ``profile_rounds``
   measurements) and each placement's layer groups are balanced on them
   (``plan_graph.group_layers``: the all-device blocks of M-shape and MLLM
   split their rows over every device, X- and K-shape run two half-batch
   towers / branches);
2. the *layer model*: the placement priced from these layer times alone
   (``plan_graph.plan_graph(mode="infer")``: devices as fast as the profiled
   one, the CPU link), searched and replayed: batch latency, one
   micro-batch's latency and throughput, comparable across placements
   because every one is priced from the same measurements;
3. ``tj.schedule`` measures that placement's blocks, searches the schedule
   and reports the predicted latency of the batch (``report
   .predicted_step_ms``: the replay on this CPU, where the fake devices
   share the process's cores) and, from the same measurements, the
   latency on dedicated devices (every device its own core:
   ``cost.predict.predict`` with each block's single-core seconds and the
   link's delays), plus the steady-state throughput of the repetend
   (rows per period) and the latency of one micro-batch;
4. where ``measure`` is set, the lowered program is compiled and timed on
   the CPU mesh (median of ``repeats`` runs) and its outputs checked
   against the plain function.

Throughput is ``N x rows`` sequences over the batch latency. With
``measure``, the unpipelined model over the same batch on one device is
timed too (``plain_ms``), the reference for the lowering's overhead.
``fresh_cache`` (without ``cache_dir``) measures into a new temporary
cache, so no measurement from an earlier run is reused. Every figure
is also given as a percentage change against the V-shape (negative latency
change = faster). ``run(args)`` writes ``<output_dir>/run_{hash}.json``;
the picture is ``python -m experiments.inference_plot <file>``.
"""

from __future__ import annotations

import contextlib
import os
import statistics
import tempfile
import time
from collections.abc import Callable
from typing import Any, NamedTuple

import jax

import tessel_jax as tj
from experiments import compare_schedules_lib, gpt_profile, rel_err, runs
from experiments import progress as progress_lib
from tessel_jax import placements as _placements
from tessel_jax.cost import link as _link
from tessel_jax.cost import predict as _predict
from tessel_jax.search import frontier, plan_graph, search_repetend

RUNNER = "inference"
BASELINE = "vshape"
#: Figures compared against the V-shape: (key, higher is better).
METRICS = (("layer_model_ms", False), ("predicted_ms", False),
           ("dedicated_ms", False), ("measured_ms", False),
           ("layer_model_microbatch_ms", False),
           ("microbatch_latency_ms", False),
           ("layer_model_throughput", True), ("predicted_throughput", True),
           ("dedicated_throughput", True), ("measured_throughput", True))


class InferenceArgs(NamedTuple):
  """Everything ``inference_lib.run`` needs; see the flags for meanings."""

  placements: tuple[str, ...] = ("vshape", "mshape", "mllm", "kshape",
                                 "xshape", "interleaved")
  devices: int = 4
  microbatches: tuple[int, ...] = (8,)
  vocab: int = 8192
  d_model: int = 128
  layers: int = 6
  heads: int = 4
  seq: int = 64
  rows: int = 8
  measure: bool = True
  repeats: int = 7
  time_limit: float = 10.0
  profile_rounds: int = 3
  seed: int = 0
  cache_dir: str | None = None
  fresh_cache: bool = True
  output_dir: str = "results/inference"


def check_args(args: InferenceArgs) -> None:
  """Raises ValueError naming a bad argument and what is allowed."""
  bad = [p for p in args.placements if p not in frontier.SUPPORTED]
  if bad or not args.placements:
    raise ValueError(f"placements {list(args.placements)}: choose from"
                     f" {list(frontier.SUPPORTED)}")
  if BASELINE not in args.placements:
    raise ValueError(f"placements must include {BASELINE!r} (the figures"
                     " are compared against it)")
  if args.devices < 1:
    raise ValueError(f"devices must be >= 1, got {args.devices}")
  if not args.microbatches or any(n < 1 for n in args.microbatches):
    raise ValueError(f"microbatches must be >= 1, got"
                     f" {list(args.microbatches)}")
  for key in ("vocab", "d_model", "layers", "heads", "seq", "rows",
              "repeats", "profile_rounds"):
    if getattr(args, key) < 1:
      raise ValueError(f"{key} must be >= 1, got {getattr(args, key)}")
  if args.d_model % args.heads:
    raise ValueError(f"d_model {args.d_model} must divide by heads"
                     f" {args.heads}")
  if args.rows % 2 or args.rows % args.devices:
    raise ValueError(f"rows {args.rows} must divide by 2 (X/K-shape halves)"
                     f" and by devices {args.devices} (all-device blocks"
                     " split rows)")
  if args.time_limit <= 0:
    raise ValueError(f"time_limit must be > 0, got {args.time_limit}")


def shape_of(args: InferenceArgs) -> gpt_profile.GPTShape:
  return gpt_profile.GPTShape(vocab=args.vocab, d_model=args.d_model,
                              layers=args.layers, heads=args.heads,
                              seq=args.seq, rows=args.rows)


def _reference(fn: Callable[[Any, Any], Any], params: Any, batch: Any,
               n: int) -> Any:
  """The plain function over ``n`` micro-batches, outputs concatenated."""
  mbs = jax.tree_util.tree_map(lambda x: x.reshape((n, -1) + x.shape[1:]),
                               batch)
  out = jax.jit(lambda p, b: jax.lax.map(lambda mb: fn(p, mb), b))(params,
                                                                    mbs)
  return out.reshape((-1,))



def dedicated_ms(built: Any, link: _link.LinkModel) -> float:
  """Batch latency if every device had its own core: the schedule replayed
  with each block's single-core seconds and the link's edge delays."""
  prof = built.profile
  seconds = {b: k.core_seconds for b, k in prof.kernels.items()}
  delays = {e: link.seconds(n) for e, n in prof.edge_bytes.items()}
  return _predict.predict(built.unrolled, seconds,
                          delays=delays).step_seconds * 1e3


def layer_model(name: str, n: int, args: InferenceArgs,
                model: frontier.ModelCosts) -> dict[str, Any]:
  """The placement priced from the per-layer profile alone (the frontier's
  model, ``mode="infer"``: every device as fast as the profiled one, the
  CPU link between them), searched and replayed in seconds.

  Every placement is priced from the same layer measurements, so their
  comparison does not depend on when each block happened to be timed.
  """
  pg = plan_graph.plan_graph(model, name, args.devices, 1, microbatches=n,
                           link=_link.default_link("cpu"), mode="infer")
  sched = search_repetend(pg.graph, None, time_limit_s=args.time_limit,
                          seed=args.seed)
  res = frontier.evaluate(pg, sched.unroll(n), memory_case="loose",
                          memory_limit_units=None, status=sched.status)
  ms = res.step_seconds * 1e3
  return {"layer_model_ms": round(ms, 4),
          "layer_model_microbatch_ms": round(
              sched.latency * res.resolution_s * 1e3, 4),
          "layer_model_throughput": round(n * args.rows / ms * 1e3, 2),
          "layer_model_source": res.source}


def placement_case(name: str, n: int, args: InferenceArgs,
                   model: frontier.ModelCosts, mesh: Any) -> dict[str, Any]:
  """Builds, predicts and (``args.measure``) times one placement."""
  shape = shape_of(args)
  graph = _placements.get(name, args.devices, mode="infer")
  slot_of, num_groups = plan_graph.slots(graph, name)
  groups = plan_graph.group_layers([l.forward_s for l in model.layers],
                                   graph, slot_of, num_groups)
  names = gpt_profile.layer_names(shape)
  modelled = layer_model(name, n, args, model)
  fn = gpt_profile.model_fn(name, shape, groups, output="nll")
  params = gpt_profile.init_params(shape, args.seed)
  batch = gpt_profile.make_batch(shape, n * args.rows, args.seed + 1)
  step = tj.schedule(fn, mesh=mesh, placement=graph, num_microbatches=n,
                     mode="infer", cost="measured", cache_dir=args.cache_dir,
                     solver_time_limit_s=args.time_limit, seed=args.seed)
  t0 = time.perf_counter()
  built = step.build(params, batch)
  build_s = time.perf_counter() - t0
  rep = built.report
  res = rep.time_resolution_s
  sched = built.schedule
  samples = n * args.rows
  row: dict[str, Any] = {
      "placement": name, "graph": graph.name, "devices": args.devices,
      "microbatches": n, "rows": args.rows,
      "groups": [names[a] if b - a == 1 else f"{names[a]}..{names[b - 1]}"
                 for a, b in groups],
      "block_ms": {k: round(v, 4) for k, v in rep.block_ms.items()},
      "spans": {b.label: b.span for b in built.graph.blocks},
      "schedule_source": built.unrolled.source,
      "period": built.unrolled.period,
      "makespan_steps": built.unrolled.makespan,
      # None when the schedule searched on uniform spans was lowered (the
      # cost model predicted it faster): its steps are not in seconds.
      "resolution_ms": round(res * 1e3, 5) if res else None,
      "ticks": rep.ticks, "bubble_ratio": round(rep.bubble_ratio, 4),
      "quantization_error": (None if rep.quantization_error is None
                             else round(rep.quantization_error, 4)),
      "predicted_ms": round(rep.predicted_step_ms, 4),
      "dedicated_ms": round(dedicated_ms(built, rep_link(rep)), 4),
      "profile_seconds": round(rep.profile_seconds, 3),
      "build_seconds": round(build_s, 3),
  }
  row.update(modelled)
  row["predicted_throughput"] = round(samples / row["predicted_ms"] * 1e3, 2)
  row["dedicated_throughput"] = round(samples / row["dedicated_ms"] * 1e3, 2)
  if sched is not None and res:
    row["microbatch_latency_ms"] = round(sched.latency * res * 1e3, 4)
    row["steady_throughput"] = round(args.rows / (sched.period * res), 2)
  if args.measure:
    try:
      t0 = time.perf_counter()
      compiled = step.lower(params, batch).compile()
      row["compile_seconds"] = round(time.perf_counter() - t0, 3)
      out = compiled(params, batch)
      row["max_rel_err"] = rel_err.max_rel(
          out, _reference(fn, params, batch, n))
      times = compare_schedules_lib.time_step(
          lambda: compiled(params, batch), args.repeats)
    except Exception as e:  # pylint: disable=broad-except
      row["measure_error"] = f"{type(e).__name__}: {e}"
      return row
    row["measured_all_ms"] = [round(t * 1e3, 3) for t in times]
    row["measured_ms"] = round(statistics.median(times) * 1e3, 4)
    row["measured_throughput"] = round(samples / row["measured_ms"] * 1e3, 2)
  return row


def plain_ms(args: InferenceArgs, n: int) -> float:
  """Median seconds (as ms) of the unpipelined model over ``n``
  micro-batches on one device (``lax.map``): the lowering's reference."""
  shape = shape_of(args)
  groups = [(0, len(gpt_profile.layer_names(shape)))]
  fn = gpt_profile.chain_fn(shape, groups, output="nll")
  params = gpt_profile.init_params(shape, args.seed)
  batch = gpt_profile.make_batch(shape, n * args.rows, args.seed + 1)
  device = jax.devices()[0]
  params, batch = jax.device_put((params, batch), device)
  mbs = jax.tree_util.tree_map(lambda x: x.reshape((n, -1) + x.shape[1:]),
                               batch)
  f = jax.jit(lambda p, b: jax.lax.map(lambda mb: fn(p, mb), b))
  times = compare_schedules_lib.time_step(lambda: f(params, mbs),
                                          args.repeats)
  return statistics.median(times) * 1e3


def rep_link(report: Any) -> _link.LinkModel:
  """The link model a report was made with."""
  d = report.link or {}
  if not d:
    return _link.default_link(report.backend or "cpu")
  return _link.LinkModel(d["latency_s"], d["bandwidth_bytes_per_s"],
                         d.get("source", "user"))


def changes(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
  """Percentage change of every metric against the V-shape of the same N.

  ``100 (x - v) / v``: negative is lower (latency: faster; throughput:
  worse).
  """
  out = []
  base = {r["microbatches"]: r for r in rows
          if r["placement"] == BASELINE and "error" not in r}
  for r in rows:
    v = base.get(r["microbatches"])
    if v is None or r["placement"] == BASELINE or "error" in r:
      continue
    entry = {"placement": r["placement"], "microbatches": r["microbatches"]}
    for key, _ in METRICS:
      if key in r and key in v and v[key]:
        entry[key] = round(100 * (r[key] - v[key]) / v[key], 2)
    out.append(entry)
  return out


def run(args: InferenceArgs,
        log: Callable[[str], None] = print) -> dict[str, Any]:
  """Runs every placement x N; writes and returns the results.

  Returns:
    ``{"runner", "args", "environment", "output", "model", "rows",
    "changes", "wall_seconds"}``: ``model`` the measured layers, ``rows``
    one dict per placement x N (or ``error``), ``changes`` the percentage
    changes against the V-shape.

  Raises:
    ValueError: for bad arguments, or fewer devices than ``args.devices``
      (the binary sets the fake CPU device count).
  """
  check_args(args)
  if len(jax.devices()) < args.devices:
    raise ValueError(
        f"{args.devices} devices needed, JAX has {len(jax.devices())}; set"
        f" XLA_FLAGS=--xla_force_host_platform_device_count={args.devices}"
        " before jax starts (python -m experiments.inference does)")
  t0 = time.perf_counter()
  results = runs.new_results(RUNNER, args)
  env = results["environment"]
  env.update(jax=jax.__version__, backend=jax.devices()[0].platform,
             load_average_start=list(os.getloadavg()))
  with contextlib.ExitStack() as stack:
    if args.cache_dir is None and args.fresh_cache:
      args = args._replace(cache_dir=stack.enter_context(
          tempfile.TemporaryDirectory(prefix="tessel_inference_cache_")))
    model = gpt_profile.profile_layers(shape_of(args), mode="infer",
                                       cache_dir=args.cache_dir,
                                       rounds=args.profile_rounds,
                                       seed=args.seed)
    log(f"layers of {model.name}: " + ", ".join(
        f"{l.name} {l.forward_s * 1e3:.3f} ms" for l in model.layers))
    results.update({"model": model.to_dict(), "rows": [], "changes": [],
                    "plain_ms": {}})
    mesh = jax.make_mesh((args.devices,), ("pipe",))
    eta = progress_lib.Eta(len(args.microbatches) * len(args.placements))
    for n in args.microbatches:
      if args.measure:
        results["plain_ms"][str(n)] = round(plain_ms(args, n), 4)
        log(f"plain (one device, unpipelined) N={n}:"
            f" {results['plain_ms'][str(n)]:.2f} ms")
      for name in args.placements:
        try:
          row = placement_case(name, n, args, model, mesh)
        except Exception as e:  # pylint: disable=broad-except
          row = {"placement": name, "microbatches": n,
                 "devices": args.devices, "error": f"{type(e).__name__}: {e}"}
        results["rows"].append(row)
        log(eta.finished(progress(row)))
        results["changes"] = changes(results["rows"])
        results["wall_seconds"] = round(time.perf_counter() - t0, 2)
        runs.write(results)
  env["load_average_end"] = list(os.getloadavg())
  results["wall_seconds"] = round(time.perf_counter() - t0, 2)
  runs.write(results)
  return results


def progress(row: dict[str, Any]) -> str:
  head = f"{row['placement']:>12} N={row['microbatches']:<4}"
  if "error" in row:
    return f"{head} ERROR {row['error']}"
  text = (f"{head} groups {row['groups']} layer model"
          f" {row['layer_model_ms']:.2f} ms, predicted"
          f" {row['predicted_ms']:.2f} ms, dedicated"
          f" {row['dedicated_ms']:.2f} ms")
  if "measured_ms" in row:
    text += (f", measured {row['measured_ms']:.2f} ms (err"
             f" {row['max_rel_err']:.1e})")
  if "measure_error" in row:
    text += f", measuring failed: {row['measure_error']}"
  return text


def _pct(entry: dict[str, Any] | None, key: str) -> str:
  if entry is None or key not in entry:
    return ""
  return f" ({entry[key]:+.1f}%)"


def summary(results: dict[str, Any]) -> str:
  """Markdown table per N: latency and throughput, change vs V-shape."""
  lines = [f"inference: {len(results['rows'])} cases in"
           f" {results['wall_seconds']:.1f} s wall ({results['output']})"]
  by = {(c["placement"], c["microbatches"]): c for c in results["changes"]}
  for n in dict.fromkeys(r["microbatches"] for r in results["rows"]):
    plain = results.get("plain_ms", {}).get(str(n))
    ref = (f"; unpipelined on one device: {plain:.2f} ms" if plain else "")
    lines += ["", f"N = {n} micro-batches (change vs {BASELINE}{ref}):", "",
              "| placement | layer model ms | layer model 1-micro-batch ms |"
              " predicted ms (this CPU) | dedicated-core ms | measured ms |"
              " measured samples/s |", "|---|---|---|---|---|---|---|"]
    for r in results["rows"]:
      if r["microbatches"] != n:
        continue
      if "error" in r:
        lines.append(f"| {r['placement']} | error: {r['error'][:80]} ||||||")
        continue
      c = by.get((r["placement"], n))

      def cell(key: str, fmt: str = ".2f") -> str:
        if key not in r:
          return "failed" if key.startswith("measured") and (
              "measure_error" in r) else "-"
        return f"{r[key]:{fmt}}{_pct(c, key)}"

      lines.append(
          f"| {r['placement']} | {cell('layer_model_ms')} |"
          f" {cell('layer_model_microbatch_ms')} | {cell('predicted_ms')} |"
          f" {cell('dedicated_ms')} | {cell('measured_ms')} |"
          f" {cell('measured_throughput', '.0f')} |")
  return "\n".join(lines)
