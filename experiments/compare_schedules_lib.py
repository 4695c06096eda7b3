"""The searched schedule against the classic ones, simulated and lowered.

For every placement: the searched schedule (under each memory case) and
every classic schedule that fits the placement (GPipe, 1F1B, interleaved
1F1B, Chimera, ZB-H1; ``baselines.for_placement``), all unrolled for the
same N, validated and measured in the same simulator (makespan, bubble
ratio, peak memory per device). The ``vshape_split`` placement (V-shape with
the backward split into ``B`` and ``W``) is where ZB-H1 applies.

Then, where they run, the same schedules lowered to one ``shard_map``
program on a CPU mesh: ``tj.schedule(fn, plan=None)`` (its own search) and
``tj.schedule(fn, plan=<baseline>)`` on a small model whose blocks follow the
placement's forward graph (``dag_model``), with build and compile times,
the median step time over ``repeats`` runs, and (``check``) the loss and
gradients against ``jax.value_and_grad`` of the plain function. The lowered
searched schedule is ``tj.schedule``'s own (its block spans and memory come
from the traced model, not from the placement's unit spans), so its makespan
is recorded next to the step time.

The process must have at least ``devices`` JAX devices: the binary sets
``--xla_force_host_platform_device_count`` before JAX starts.

``run(args)`` writes ``<output_dir>/run_{hash}.json`` (with every schedule's
actions, for the Gantt charts of ``plot_results``) after every placement.
Nothing here reads flags.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

import tessel_jax as tj
from experiments import (lowering_bench_lib, rel_err, runs, search_cases_lib,
                         search_lib)
from tessel_jax import placements
from tessel_jax.graph import BlockGraph, PlacementError
from tessel_jax.schedule import UnrolledSchedule
from tessel_jax.search import baselines

RUNNER = "compare_schedules"

#: Placements that are a named placement with other arguments.
VARIANTS: dict[str, tuple[str, dict[str, Any]]] = {
    "vshape_split": ("vshape", {"split_backward": True}),
}
#: Memory cases of the searched schedule (besides an integer limit).
MEMORY_CASES = ("loose", "baseline", "each", "tight", "fast")
#: Label of the searched schedule.
SEARCHED = "tessel"


class CompareArgs(NamedTuple):
  """Everything ``compare_schedules_lib.run`` needs; see the flags."""

  placements: tuple[str, ...] | None = None
  devices: int = 4
  microbatches: int = 16
  memories: tuple[str, ...] = ("loose", "baseline")
  time_limit: float = 10.0
  seed: int = 0
  lower: bool = True
  hidden: int = 128
  rows: int = 16
  repeats: int = 5
  check: bool = True
  output_dir: str = "results/compare_schedules"


def placement_names() -> list[str]:
  """Every placement this runner knows: the named ones and ``VARIANTS``."""
  return list(placements.PLACEMENTS) + list(VARIANTS)


def check_args(args: CompareArgs) -> None:
  """Raises ValueError naming a bad argument (and what is allowed)."""
  known = placement_names()
  unknown = [p for p in args.placements or () if p not in known]
  if unknown:
    raise ValueError(f"unknown placements {unknown}; known: {known}")
  for memory in args.memories:
    if memory not in MEMORY_CASES and not _is_int(memory):
      raise ValueError(f"memory {memory!r}: give one of {list(MEMORY_CASES)}"
                       " or an integer limit")
  if not args.memories:
    raise ValueError("memories is empty: give at least one memory case")
  for name in ("devices", "microbatches", "hidden", "rows", "repeats"):
    if getattr(args, name) < 1:
      raise ValueError(f"{name} must be >= 1, got {getattr(args, name)}")
  if args.time_limit <= 0:
    raise ValueError(f"time_limit must be > 0, got {args.time_limit}")


def _is_int(text: str) -> bool:
  return text.lstrip("-").isdigit()


def _error(e: BaseException) -> str:
  return f"{type(e).__name__}: {e}"


def build_graph(name: str, devices: int) -> BlockGraph:
  """The training graph of a named placement or of a ``VARIANTS`` entry.

  Raises:
    PlacementError: for an unknown name or an unsupported device count.
  """
  base, kwargs = VARIANTS.get(name, (name, {}))
  return placements.get(base, devices, **kwargs)


# --- simulator --------------------------------------------------------------


def schedule_entry(unrolled: UnrolledSchedule, kind: str,
                   **extra: Any) -> dict[str, Any]:
  """Validated figures of one schedule plus its actions (for the Gantt)."""
  entry: dict[str, Any] = {"kind": kind, "source": unrolled.source,
                           "memory_limit": unrolled.memory_limit,
                           "period": unrolled.period, **extra}
  entry.update(search_lib.measure(unrolled))
  entry["schedule"] = unrolled.to_dict()
  return entry


def memory_limit(graph: BlockGraph, memory: str,
                 entries: dict[str, dict[str, Any]],
                 args: CompareArgs) -> tuple[int | None, dict[str, Any]]:
  """The limit of a memory case and how it was found.

  ``loose``: none; ``baseline``: the smallest peak memory among the classic
  schedules other than GPipe (GPipe if it is the only one), so the search
  runs under the memory the best classic schedule needs; ``tight``/``fast``:
  as in ``search_cases``; an integer: itself.
  """
  if memory == "loose":
    return None, {}
  if _is_int(memory):
    return int(memory), {}
  if memory == "baseline":
    peaks = {n: e["max_peak_memory"] for n, e in entries.items()
             if e.get("kind") == "baseline" and "error" not in e}
    if not peaks:
      raise ValueError("no classic schedule fits this placement")
    frugal = {n: p for n, p in peaks.items() if n != "gpipe"} or peaks
    name = min(frugal, key=frugal.get)
    return frugal[name], {"memory_from": name}
  row = search_cases_lib.memory_cases(
      graph, (memory,), allow_wrap=True, time_limit_s=args.time_limit,
      seed=args.seed, workers=1)[0]
  if "error" in row:
    raise ValueError(row["error"])
  return row["memory_limit"], {"memory_search_seconds":
                               row.get("memory_search_seconds")}


def _memory_cases(memories: Sequence[str],
                  entries: dict[str, dict[str, Any]]
                  ) -> list[tuple[str, str, int | None]]:
  """``(case, label, limit or None)`` of every search to run; ``each``
  becomes one search at every classic schedule's peak memory (GPipe's
  aside), labelled ``tessel@=<baseline>``."""
  out = []
  for memory in memories:
    if memory != "each":
      label = SEARCHED if memory == "loose" else f"{SEARCHED}@{memory}"
      out.append((memory, label, None))
      continue
    for name, e in entries.items():
      if name != "gpipe" and "error" not in e:
        out.append((f"={name}", f"{SEARCHED}@={name}", e["max_peak_memory"]))
  return out


def simulate_all(graph: BlockGraph, args: CompareArgs) -> dict[str, Any]:
  """Every classic schedule and the searched one(s), in the simulator."""
  n = args.microbatches
  entries: dict[str, dict[str, Any]] = {}
  for name in baselines.for_placement(graph):
    try:
      entries[name] = schedule_entry(baselines.run(name, graph, n), "baseline")
    except Exception as e:  # pylint: disable=broad-except
      entries[name] = {"kind": "baseline", "error": _error(e)}
  searched: dict[str, dict[str, Any]] = {}
  for memory, label, limit in _memory_cases(args.memories, entries):
    try:
      limit, how = ((limit, {"memory_from": memory[1:]}) if limit is not None
                    else memory_limit(graph, memory, entries, args))
      _, unrolled, figures = search_lib.search_and_measure(
          graph, limit, n, time_limit_s=args.time_limit, seed=args.seed)
      entry = schedule_entry(unrolled, "searched", memory_case=memory, **how)
      for key in ("status", "period_lower_bound", "search_seconds",
                  "period_seconds", "latency_status", "repetend_makespan"):
        if key in figures:
          entry[key] = figures[key]
    except Exception as e:  # pylint: disable=broad-except
      entry = {"kind": "searched", "memory_case": memory, "error": _error(e)}
    searched[label] = entry
  return {**searched, **entries}


def speedups(entries: dict[str, dict[str, Any]]) -> dict[str, Any]:
  """Each searched makespan against the best classic schedule.

  ``best_baseline``: the shortest classic schedule whatever its memory;
  ``best_baseline_within_memory``: the shortest one whose peak memory is at
  most the searched schedule's (absent when none is). Speed-up = baseline
  makespan / searched makespan.
  """
  base = {n: b for n, b in entries.items()
          if b.get("kind") == "baseline" and "error" not in b}
  out = {}
  for label, e in entries.items():
    if e.get("kind") != "searched" or "error" in e or not base:
      continue
    row: dict[str, Any] = {}
    best = min(base, key=lambda n: base[n]["makespan"])
    row["best_baseline"] = best
    row["speedup"] = round(base[best]["makespan"] / e["makespan"], 4)
    fitting = [n for n in base
               if base[n]["max_peak_memory"] <= e["max_peak_memory"]]
    if fitting:
      best = min(fitting, key=lambda n: base[n]["makespan"])
      row["best_baseline_within_memory"] = best
      row["speedup_within_memory"] = round(
          base[best]["makespan"] / e["makespan"], 4)
    out[label] = row
  return out


# --- lowered program ----------------------------------------------------------


def dag_model(graph: BlockGraph, hidden: int, seed: int = 0
              ) -> tuple[Callable[[Any, Any], Any], list[dict[str, Any]]]:
  """A model whose forward blocks follow ``graph``'s forward edges.

  Forward block ``i`` (in id order, a topological order) computes
  ``h_i = tanh(x W_i + b_i) + x`` where ``x`` is the batch input for a block
  without forward predecessors and the sum of its predecessors' outputs
  otherwise; a block without successors turns ``h_i`` into a squared-error
  loss against ``batch["y"]`` and the step returns the sum of those losses.
  Every block but the last ends with ``tj.boundary``. A block without a
  backward in the graph (frozen) sees its parameters and its output through
  ``lax.stop_gradient``. Batches come from ``lowering_bench_lib.make_batch``.

  Returns:
    ``(fn, params)`` with one ``{"w", "b"}`` per forward block.
  """
  forward = sorted((b.id for b in graph.blocks if b.kind == "F"))
  preds: dict[int, list[int]] = {i: [] for i in forward}
  succs: dict[int, list[int]] = {i: [] for i in forward}
  for e in graph.edges:
    if e.src in preds and e.dst in preds:
      preds[e.dst].append(e.src)
      succs[e.src].append(e.dst)
  trained = set(placements.backward_of(graph).values())
  keys = jax.random.split(jax.random.PRNGKey(seed), len(forward))
  params = [{"w": jax.random.normal(k, (hidden, hidden)) / np.sqrt(hidden),
             "b": jnp.zeros((hidden,))} for k in keys]
  last = forward[-1]

  def dag_loss(p: Any, batch: Any) -> Any:
    outs: dict[int, Any] = {}
    losses = []
    for pos, i in enumerate(forward):
      x = batch["x"] if not preds[i] else sum(outs[j] for j in preds[i])
      w = p[pos] if i in trained else jax.lax.stop_gradient(p[pos])
      h = jnp.tanh(x @ w["w"] + w["b"]) + x
      if i not in trained:
        h = jax.lax.stop_gradient(h)
      value = h if succs[i] else jnp.mean((h - batch["y"]) ** 2)
      if i != last:
        value = tj.boundary(value)
      if succs[i]:
        outs[i] = value
      else:
        losses.append(value)
    return sum(losses)

  return dag_loss, params



def _reference(fn: Callable[[Any, Any], Any], params: Any, batch: Any,
               n: int) -> Any:
  def mean_loss(p):
    mbs = jax.tree_util.tree_map(
        lambda x: x.reshape((n, -1) + x.shape[1:]), batch)
    return jnp.mean(jax.lax.map(lambda mb: fn(p, mb), mbs))
  return jax.jit(jax.value_and_grad(mean_loss))(params)


def time_step(compiled: Callable[[], Any], repeats: int) -> list[float]:
  """Wall seconds of ``repeats`` runs after one warm-up run."""
  jax.block_until_ready(compiled())
  out = []
  for _ in range(repeats):
    t0 = time.perf_counter()
    jax.block_until_ready(compiled())
    out.append(time.perf_counter() - t0)
  return out


def lower_all(graph: BlockGraph, plans: list[str | None],
              args: CompareArgs) -> dict[str, dict[str, Any]]:
  """Each plan (None: searched) lowered, timed and (``check``) checked."""
  d, n = graph.num_devices, args.microbatches
  if len(jax.devices()) < d:
    raise ValueError(
        f"{d} devices needed, JAX has {len(jax.devices())}; set"
        f" XLA_FLAGS=--xla_force_host_platform_device_count={d} before JAX"
        " starts (python -m experiments.compare_schedules does)")
  mesh = jax.make_mesh((d,), ("pipe",), devices=jax.devices()[:d])
  fn, params = dag_model(graph, args.hidden, args.seed)
  batch = lowering_bench_lib.make_batch(n * args.rows, args.hidden)
  reference = _reference(fn, params, batch, n) if args.check else None
  out: dict[str, dict[str, Any]] = {}
  for plan in plans:
    label = plan or SEARCHED
    row: dict[str, Any] = {"plan": plan}
    try:
      step = tj.schedule(fn, mesh=mesh, placement=graph, num_microbatches=n,
                         plan=plan, solver_time_limit_s=args.time_limit,
                         seed=args.seed)
      t0 = time.perf_counter()
      built = step.build(params, batch)
      row["build_seconds"] = round(time.perf_counter() - t0, 3)
      t0 = time.perf_counter()
      compiled = step.lower(params, batch).compile()
      row["compile_seconds"] = round(time.perf_counter() - t0, 3)
      runs_s = time_step(lambda: compiled(params, batch), args.repeats)
      row["step_seconds"] = round(statistics.median(runs_s), 6)
      row["step_seconds_all"] = [round(t, 6) for t in runs_s]
      row["makespan"] = built.unrolled.makespan
      row["source"] = built.unrolled.source
      if reference is not None:
        loss, grads = compiled(params, batch)
        row["check_loss_rel_err"] = rel_err.max_rel(loss, reference[0])
        row["check_grad_rel_err"] = rel_err.max_rel(grads, reference[1])
    except Exception as e:  # pylint: disable=broad-except
      row["error"] = _error(e)
    out[label] = row
  return out


# --- run ----------------------------------------------------------------------


def compare_placement(name: str, args: CompareArgs) -> dict[str, Any]:
  """Simulated (and lowered) comparison of one placement."""
  row: dict[str, Any] = {"placement": name, "devices": args.devices,
                         "num_microbatches": args.microbatches}
  try:
    graph = build_graph(name, args.devices)
  except (PlacementError, ValueError) as e:
    row["error"] = _error(e)
    return row
  row["graph"] = graph.to_dict()
  row["schedules"] = simulate_all(graph, args)
  row["speedups"] = speedups(row["schedules"])
  if args.lower:
    plans = [None] + [n for n, e in row["schedules"].items()
                      if e["kind"] == "baseline" and "error" not in e]
    try:
      row["lowered"] = lower_all(graph, plans, args)
    except Exception as e:  # pylint: disable=broad-except
      row["lowered_error"] = _error(e)
  return row


def run(args: CompareArgs,
        log: Callable[[str], None] = print) -> dict[str, Any]:
  """Compares every selected placement; writes ``run_{hash}.json``.

  Returns:
    ``{"runner", "args", "environment", "output", "placements",
    "wall_seconds"}``; ``placements`` has one dict per placement with
    ``graph`` (its JSON object), ``schedules`` (label -> figures and the
    DESIGN §4 schedule JSON, or ``error``), ``speedups`` and ``lowered``
    (label -> build/compile/step seconds, or ``error``).

  Raises:
    ValueError: for bad arguments (see ``check_args``).
  """
  check_args(args)
  t0 = time.perf_counter()
  results = runs.new_results(RUNNER, args)
  results.update({"placements": [], "wall_seconds": 0.0,
                  "jax": jax.__version__})
  for name in args.placements or placement_names():
    row = compare_placement(name, args)
    results["placements"].append(row)
    results["wall_seconds"] = round(time.perf_counter() - t0, 2)
    runs.write(results)
    for line in report(row):
      log(line)
  return results


def report(row: dict[str, Any]) -> list[str]:
  """Text lines for one placement: every schedule's figures."""
  head = f"{row['placement']} d{row['devices']} N={row['num_microbatches']}"
  if "error" in row:
    return [f"{head}: error {row['error']}"]
  lines = [head]
  lowered = row.get("lowered", {})
  for label, e in row["schedules"].items():
    if "error" in e:
      lines.append(f"  {label:<18} error {e['error']}")
      continue
    text = (f"  {label:<18} makespan {e['makespan']:>5}  bubble"
            f" {100 * e['bubble_ratio']:5.1f}%  peak {e['max_peak_memory']:>4}")
    low = lowered.get(label)  # the limited searches are not lowered
    if low and "error" not in low:
      text += (f"  | lowered: step {1e3 * low['step_seconds']:.1f} ms"
               f" (makespan {low['makespan']}), compile"
               f" {low['compile_seconds']:.1f} s")
    elif low and "error" in low:
      text += f"  | lowered: error {low['error'][:120]}"
    lines.append(text)
  if "lowered_error" in row:
    lines.append(f"  lowering skipped: {row['lowered_error']}")
  entries = row.get("schedules", {})
  for label, s in row.get("speedups", {}).items():
    mine = entries[label]["makespan"]
    best = s["best_baseline"]
    text = "  " + versus(label, mine, best, entries[best]["makespan"])
    fit = s.get("best_baseline_within_memory")
    if fit is not None and fit != best:
      text += (f"; within its memory: vs {fit}"
               f" {versus_tail(mine, entries[fit]['makespan'])}")
    lines.append(text)
  return lines


def versus_tail(mine: int, theirs: int) -> str:
  """``"89 (7% shorter)"``: the other makespan and the change against it."""
  change = round(100 * (theirs - mine) / theirs) if theirs else 0
  if change > 0:
    return f"{theirs} ({change}% shorter)"
  if change < 0:
    return f"{theirs} ({-change}% longer)"
  return f"{theirs} ({'equal' if mine == theirs else 'within 1%'})"


def versus(label: str, mine: int, other: str, theirs: int) -> str:
  """``"tessel 83 steps vs zb_h1 89 (7% shorter)"``."""
  return f"{label} {mine} steps vs {other} {versus_tail(mine, theirs)}"
