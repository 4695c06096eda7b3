"""Kernels inside the lowered program against their profiles (no flags here).

See ``experiments.model_zoo_kernels``. ``cost="measured"`` prices a step
as the kernels' profiled seconds (each kernel jitted alone,
``cost.measure``) plus what the program pays around them (``cost.ports``:
per port operation, fitted once per machine on a *stand-in* program whose
kernels are replaced by near-free values). Where the zoo's programs run
longer than predicted, either the kernels run slower inside the program
than alone, or the program around them costs more than its stand-in. This
runner tells the two apart, per model, in one process of 2 fake
single-threaded CPU devices:

* each kernel's time inside the program: the self time of the XLA thunks
  under its name scope (``passes.lower``: ``tj_kernel/k<id>``) in XLA's
  trace, per run (:func:`kernel_split`), beside its profiled seconds;
* the program's time outside its kernels (real step minus the busier
  device's in-program kernel time) beside the stand-in program's step;
* thunks per device and step, kernel thunks apart;
* each kernel timed per run inside a loop (``experiments.looped_time``: no call
  around it), the busier device's sum beside what the kernels add to the
  stand-in: the real and stand-in programs are timed in alternated rounds
  (:func:`paired_steps`), so "real - stand-in" is a paired figure.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import glob
import gzip
import json
import os
import random
import re
import statistics
import tempfile
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any, NamedTuple

import jax
import numpy as np

import tessel_jax as tj
from experiments import looped_time as _looped
from experiments import model_zoo_rows, realtime, step_profile
from experiments.model_zoo_rows import ZOO_MODELS
from experiments.model_zoo_models import BUILDERS
from tessel_jax import step_build as _step_build
from tessel_jax.cost import calibrate as _calibrate

REST = "rest"
_KERNEL = re.compile(r"tj_kernel/k(\d+)")


class KernelsArgs(NamedTuple):
  """Everything the runner needs; see the flags."""

  models: tuple[str, ...] = ZOO_MODELS
  microbatches: int = 8
  rows: int = 4
  traces: int = 3
  rounds: int = 5
  realtime: bool = True
  output: str | None = "results/model_zoo/kernels.json"
  reference: str | None = "nnx_bn_cnn"


def instruction_kernels(hlo_text: str) -> dict[str, str]:
  """HLO instruction name -> ``"k<id>"`` (under a kernel's scope) or
  :data:`REST`."""
  out = {}
  for line in hlo_text.splitlines():
    m = step_profile._INSTR.match(line)  # pylint: disable=protected-access
    if not m:
      continue
    op = step_profile._OP_NAME.search(line)  # pylint: disable=protected-access
    k = _KERNEL.search(op.group(1)) if op else None
    out[m.group(1)] = f"k{k.group(1)}" if k else REST
  return out


def kernel_split(events: Sequence[Mapping[str, Any]],
                 where: Mapping[str, str]
                 ) -> tuple[dict[str, float], dict[str, int], list[int]]:
  """``(self seconds per key, thunks per key, thunks per thread)`` of one
  traced step: every complete event (``ph == "X"``) named after an HLO
  instruction of ``where`` counts its duration minus its children's on
  the same thread (a ``conditional`` or ``while`` contains the thunks it
  runs)."""
  by_tid: dict[Any, list] = collections.defaultdict(list)
  for e in events:
    if e.get("ph") == "X" and e.get("name") in where:
      by_tid[e.get("tid")].append(
          (float(e["ts"]), float(e.get("dur", 0.0)), where[e["name"]]))
  own: dict[str, float] = collections.defaultdict(float)
  count: collections.Counter = collections.Counter()
  per_thread = []
  for evs in by_tid.values():
    evs.sort(key=lambda x: (x[0], -x[1]))
    stack: list[list] = []          # [end, key, self_us]
    for ts, dur, key in evs:
      while stack and stack[-1][0] <= ts:
        _, k, s = stack.pop()
        own[k] += s
      if stack:
        stack[-1][2] -= dur
      stack.append([ts + dur, key, dur])
      count[key] += 1
    for _, k, s in stack:
      own[k] += s
    per_thread.append(len(evs))
  return ({k: v * 1e-6 for k, v in own.items()}, dict(count),
          sorted(per_thread, reverse=True))


def traced_split(run: Callable[[], Any], where: Mapping[str, str],
                 traces: int) -> tuple[dict[str, float], dict[str, int],
                                        list[int]]:
  """:func:`kernel_split` of the traced step of median wall time."""
  rows = []
  for _ in range(max(1, traces)):
    with tempfile.TemporaryDirectory() as tmp:
      jax.profiler.start_trace(tmp)
      t0 = _now()
      jax.block_until_ready(run())
      wall = _now() - t0
      jax.profiler.stop_trace()
      path = sorted(glob.glob(f"{tmp}/**/*.trace.json.gz", recursive=True))
      with gzip.open(path[-1]) as f:
        trace = json.load(f)
    events = trace["traceEvents"] if isinstance(trace, dict) else trace
    rows.append((wall, kernel_split(events, where)))
  rows.sort(key=lambda r: r[0])
  return rows[len(rows) // 2][1]


def _now() -> float:
  import time  # pylint: disable=import-outside-toplevel
  return time.perf_counter()


@contextlib.contextmanager
def captured_timer(timers: list[Callable[[Any], float]]) -> Iterator[None]:
  """Keeps every ``plan -> seconds`` program timer a build makes
  (``cost.calibrate.program_timer``) in ``timers``; each carries its
  ``(make_program, params, batch)`` as ``program_args``."""
  orig = _step_build._calibrate.program_timer  # pylint: disable=protected-access

  def keep(*a: Any, **kw: Any) -> Callable[[Any], float]:
    timer = orig(*a, **kw)
    timer.program_args = a[:3]
    timers.append(timer)
    return timer

  _step_build._calibrate.program_timer = keep  # pylint: disable=protected-access
  try:
    yield
  finally:
    _step_build._calibrate.program_timer = orig  # pylint: disable=protected-access


def paired_steps(runs: Mapping[str, Callable[[], Any]], rounds: int,
                 seed: int = 0,
                 timer: Callable[[Callable[[], Any]], float] | None = None
                 ) -> dict[str, list[float]]:
  """Seconds per step of each of ``runs`` (compiled, by name), timed in
  ``rounds`` rounds, each running every program once in shuffled order
  (its fastest sample, ``cost.calibrate.time_step``): two programs
  compared round by round met the same load."""
  timer = timer or (lambda run: _calibrate.time_step(run, fastest=True))
  rng = random.Random(seed)
  out: dict[str, list[float]] = {name: [] for name in runs}
  for _ in range(max(1, rounds)):
    order = sorted(runs)
    rng.shuffle(order)
    for name in order:
      out[name].append(timer(runs[name]))
  return out


def standin_run(timer: Callable[..., float], plan: Any
                ) -> Callable[[], Any]:
  """The compiled stand-in program of ``plan`` as ``timer`` (a captured
  ``program_timer``) would time it, ready to call."""
  make_program, params, batch = timer.program_args
  params = _calibrate._concrete(params)  # pylint: disable=protected-access
  batch = _calibrate._concrete(batch)  # pylint: disable=protected-access
  compiled = jax.jit(make_program(_calibrate.standin_plan(plan))).lower(
      params, batch).compile()
  return lambda: compiled(params, batch)


def busier(per_kernel_ms: Mapping[str, float], kernels: Mapping[int, Any],
           n: int) -> float:
  """Milliseconds per step of the device whose kernels take longest
  (``per_kernel_ms``: by label, one run; ``n`` runs each)."""
  load: dict[int, float] = collections.defaultdict(float)
  for k in kernels.values():
    for d in k.devices:
      load[d] += n * per_kernel_ms.get(k.label, 0.0)
  return max(load.values(), default=0.0)


def lockstep(per_kernel_ms: Mapping[str, float], plan: Any) -> float:
  """Milliseconds per step of ``plan``'s kernels on its critical path
  when its devices run in lockstep (a rendezvous every tick, the CPU
  backend): over the ticks, the sum of the slowest kernel of each tick
  (``per_kernel_ms``: by label, one run)."""
  return sum(max((per_kernel_ms.get(plan.kernels[k].label, 0.0)
                  for k in tick.kernels if k is not None), default=0.0)
             for tick in plan.ticks)


def lockstep_thunks(per_kernel_ms: Mapping[str, float],
                    thunks: Mapping[str, int], plan: Any) -> int:
  """Thunks on the critical path of ``plan``'s lockstep ticks: over the
  ticks, the thunks of each tick's slowest kernel (by ``per_kernel_ms``,
  its loop figure; :func:`lockstep`)."""
  total = 0
  for tick in plan.ticks:
    labels = [plan.kernels[k].label for k in tick.kernels if k is not None]
    if labels:
      total += thunks.get(max(labels, key=lambda l: per_kernel_ms.get(l, 0.0)),
                          0)
  return total


def per_thunk_ms(ref: Mapping[str, Any]) -> float | None:
  """Milliseconds per thunk fitted on the reference row: what its
  kernels add to its stand-in (paired) less their loop figure on the
  lockstep path, over that path's thunks (None where not measured)."""
  added = ref.get("real_minus_standin_ms")
  n = ref.get("lockstep_thunks")
  if added is None or not n:
    return None
  return (added - ref["kernels_looped_lockstep_ms"]) / n


def with_thunk_pricing(row: dict[str, Any], per_thunk: float | None
                       ) -> dict[str, Any]:
  """``row`` with its kernels priced as loop + thunks x ``per_thunk`` ms
  (the lockstep path's figure swapped into the prediction, as
  ``predicted_looped_ms``) and real over that prediction. A negative
  figure (the reference's kernels add less than their loop figure) prices
  no thunk: the loop alone."""
  if per_thunk is None or "error" in row:
    return row
  per_thunk = max(0.0, per_thunk)
  kernels = (row["kernels_looped_lockstep_ms"] +
             per_thunk * row["lockstep_thunks"])
  pred = row["predicted_ms"] - row["kernels_profiled_lockstep_ms"] + kernels
  return {**row, "per_thunk_us": round(1e3 * per_thunk, 4),
          "kernels_thunk_priced_ms": round(kernels, 3),
          "predicted_thunk_priced_ms": round(pred, 3),
          "real_over_predicted": round(row["real_ms"] / row["predicted_ms"], 3),
          "real_over_thunk_priced": round(row["real_ms"] / pred, 3),
          # The kernel term alone: what they add (paired) over its price.
          "added_over_thunk_priced": (
              None if row.get("real_minus_standin_ms") is None else
              round(row["real_minus_standin_ms"] / max(kernels, 1e-9), 3))}


def replayed_kernels(replay_run: Any, unrolled: Any, plan: Any,
                     work_s: Mapping[int, float]) -> float:
  """Seconds the build's replay (``step.replay_run``: the tick model,
  the devices' shared cores, their overlap) gives the kernels priced at
  ``work_s`` (block id -> core-seconds per run, CPU) above the same
  replay with zero-time kernels."""
  costs = replay_run.costs

  def replay(work: Mapping[int, float]) -> float:
    priced = dataclasses.replace(costs, work=dict(work))
    return replay_run.model.replay_like(priced, unrolled, plan,
                                        replay_run.mesh, replay_run.pipe_axis,
                                        replay_run.extra_s)

  return replay(work_s) - replay({b: 0.0 for b in costs.work})


def thunk_work(loop_s: Mapping[int, float], thunks: Mapping[int, int],
               per_thunk_s: float) -> dict[int, float]:
  """Block id -> seconds per run: loop figure + thunks x ``per_thunk_s``."""
  return {b: loop_s[b] + thunks[b] * per_thunk_s for b in loop_s}


def replay_fit(added_s: float, kernel_term: Callable[[float], float],
               probe_s: float = 1e-6, steps: int = 40) -> float:
  """Seconds per thunk at which ``kernel_term(per_thunk)`` (the replayed
  kernels, :func:`replayed_kernels`: non-decreasing, flat while the
  other device hides the thunks) equals ``added_s`` (the reference's
  paired real - stand-in), by bisection; where the loop alone already
  exceeds it, the negative figure the term's slope over ``probe_s``
  extrapolates to (0 where it is flat)."""
  base = kernel_term(0.0)
  if base >= added_s:
    slope = (kernel_term(probe_s) - base) / probe_s
    return (added_s - base) / slope if slope > 0 else 0.0
  lo, hi = 0.0, probe_s
  for _ in range(steps):
    if kernel_term(hi) >= added_s:
      break
    lo, hi = hi, 2 * hi
  for _ in range(steps):
    mid = 0.5 * (lo + hi)
    lo, hi = (mid, hi) if kernel_term(mid) < added_s else (lo, mid)
  return 0.5 * (lo + hi)


def with_replay_pricing(row: dict[str, Any], per_thunk_s: float | None,
                        term: Callable[[float], float] | None
                        ) -> dict[str, Any]:
  """``row`` with its kernels replayed (``term``) at
  loop + thunks x ``per_thunk_s`` (clamped at 0): the step predicted so
  (the profiled kernel term swapped out) and what the kernels add over
  that term."""
  if per_thunk_s is None or term is None or "error" in row:
    return row
  kernels_ms = 1e3 * term(max(0.0, per_thunk_s))
  pred = row["predicted_ms"] - row["replayed_profiled_ms"] + kernels_ms
  added = row.get("real_minus_standin_ms")
  return {**row, "replay_per_thunk_us": round(1e6 * per_thunk_s, 4),
          "replayed_thunk_priced_ms": round(kernels_ms, 3),
          "predicted_replay_priced_ms": round(pred, 3),
          "real_over_replay_priced": round(row["real_ms"] / pred, 3),
          "added_over_replay_priced": (
              None if added is None else round(added / max(kernels_ms, 1e-9),
                                               3))}


def _timed_steps(step: Any, model: Any, args: KernelsArgs
                 ) -> tuple[Any, Any, dict[str, Any]]:
  """``step`` built (its stand-in timer captured) and compiled; the real
  program and its stand-in timed in paired rounds.

  Returns:
    The build, the compiled program's ``run`` and ``{"real", "standin",
    "added"}`` medians in seconds (the last two None without a stand-in).
  """
  timers: list[Callable[[Any], float]] = []
  if args.realtime:
    # From the build on, as model_zoo_spans: the profile and the per-port
    # record's stand-in are timed at the priority the programs are. Built
    # at normal priority (the old order) the stand-in part was priced
    # 0.55-0.94x the stand-in timed after it, the reference CNN's own
    # 0.60-0.72x (helper zoo10, session 34).
    realtime.realtime_threads()
  with captured_timer(timers):
    built = step.build(model.params, model.batch)
  compiled = built.jitted.lower(model.params, model.batch).compile()
  run = lambda: compiled(model.params, model.batch)
  if args.realtime:
    realtime.realtime_threads()   # threads the compile started
  jax.block_until_ready(run())
  runs = {"real": run}
  if timers:
    runs["standin"] = standin_run(timers[-1], built.plan)
  steps = paired_steps(runs, args.rounds)
  timed = {"real": statistics.median(steps["real"]), "standin": None,
           "added": None}
  if timers:
    timed["standin"] = statistics.median(steps["standin"])
    timed["added"] = statistics.median(
        r - s for r, s in zip(steps["real"], steps["standin"]))
  return built, (run, compiled), timed


def _kernel_table(built: Any, run: Any, compiled: Any, args: KernelsArgs,
                  device: Any) -> tuple[dict[str, dict[str, Any]],
                                        dict[str, int], list[float]]:
  """Per kernel label: devices, profiled / in-program / looped ms per
  micro-batch and thunk counts; with the traced thunk counts by scope and
  the thunk counts per thread."""
  plan, n, rep = built.plan, args.microbatches, built.report
  alone = {k.label: k for k in built.kernels.kernels.values()}
  avals = built.partition.traced.param_avals
  own, count, threads = traced_split(run, instruction_kernels(
      compiled.as_text()), args.traces)
  kernels = {}
  for kid, k in sorted(plan.kernels.items()):
    kernels[k.label] = {
        "devices": list(k.devices),
        "profiled_ms": round(rep.block_ms.get(k.label, 0.0), 4),
        "in_program_ms": round(1e3 * own.get(f"k{kid}", 0.0) / n, 4),
        "looped_ms": round(1e3 * _looped.looped_kernel_seconds(
            alone[k.label], avals, device), 4),
        "thunks_per_run": count.get(f"k{kid}", 0) / n,
        "thunks_alone": _looped.kernel_thunks(alone[k.label], avals, device)}
  return kernels, count, threads


def _replay_terms(step: Any, built: Any, kernels: dict[str, dict[str, Any]]
                  ) -> tuple[Callable[[float], float] | None, float | None]:
  """The replay's kernel term as a function of the seconds per thunk, and
  its profiled term (both None where the build has no replay)."""
  plan, replay_run = built.plan, step.replay_run
  if replay_run is None or replay_run.costs.work is None:
    return None, None
  loop_s = {b: 1e-3 * kernels[plan.kernels[b].label]["looped_ms"]
            for b in replay_run.costs.work}
  thunks_b = {b: kernels[plan.kernels[b].label]["thunks_alone"]
              for b in replay_run.costs.work}
  term = lambda f: replayed_kernels(replay_run, built.unrolled, plan,
                                    thunk_work(loop_s, thunks_b, f))
  profiled = replayed_kernels(replay_run, built.unrolled, plan,
                              replay_run.costs.work)
  return term, profiled


def _ms(seconds: float | None) -> float | None:
  return None if seconds is None else round(1e3 * seconds, 3)


def model_row(name: str, args: KernelsArgs, mesh: Any,
              terms: dict[str, Callable[[float], float]] | None = None
              ) -> dict[str, Any]:
  """One model: kernels profiled and in the program, real and stand-in
  steps (ms); ``terms[name]``: its replayed kernel term as a function of
  the seconds per thunk (:func:`replayed_kernels`), where replayed."""
  model = BUILDERS[name](args.rows * args.microbatches)
  step = tj.schedule(model.fn, mesh=mesh, placement=tj.placements.vshape(2),
                     num_microbatches=args.microbatches,
                     has_aux=model.has_aux, cut="auto", cost="measured")
  built, (run, compiled), timed = _timed_steps(step, model, args)
  rep, plan, n = built.report, built.plan, args.microbatches
  kernels, count, threads = _kernel_table(built, run, compiled, args,
                                          mesh.devices.flat[0])
  prof = busier({l: v["profiled_ms"] for l, v in kernels.items()},
                plan.kernels, n)
  inprog = busier({l: v["in_program_ms"] for l, v in kernels.items()},
                  plan.kernels, n)
  looped_ms = {l: v["looped_ms"] for l, v in kernels.items()}
  looped = busier(looped_ms, plan.kernels, n)
  prof_lock = lockstep({l: v["profiled_ms"] for l, v in kernels.items()},
                       plan)
  looped_lock = lockstep(looped_ms, plan)
  kernel_thunks = sum(count.get(f"k{kid}", 0) for kid in plan.kernels)
  term, profiled_term = _replay_terms(step, built, kernels)
  if terms is not None and term is not None:
    terms[name] = term
  lock_thunks = lockstep_thunks(
      looped_ms, {l: v["thunks_alone"] for l, v in kernels.items()}, plan)
  return {
      "model": name, "lowered_as": plan.loop_summary(),
      "predicted_ms": round(rep.predicted_step_ms, 3),
      "predicted_outside_ms": round(rep.outside_ms, 3),
      "predicted_ticks_ms": round(
          rep.predicted_step_ms - rep.outside_ms - prof, 3),
      "tick_overhead_ms": round(rep.tick_overhead_ms, 4),
      "ticks": rep.ticks,
      "real_ms": _ms(timed["real"]),
      "standin_ms": _ms(timed["standin"]),
      # What the kernels add to the program around them (its stand-in),
      # beside their profiled and in-program figures.
      "real_minus_standin_ms": _ms(timed["added"]),
      "kernels_profiled_ms": round(prof, 3),
      "kernels_looped_ms": round(looped, 3),
      # On the critical path of lockstep ticks (what "real - stand-in"
      # measures), and the prediction were the kernels priced in a loop.
      "kernels_profiled_lockstep_ms": round(prof_lock, 3),
      "kernels_looped_lockstep_ms": round(looped_lock, 3),
      "lockstep_thunks": lock_thunks,
      # The replay's kernel term (ms): profiled, and the loop alone.
      "replayed_profiled_ms": _ms(profiled_term),
      "replayed_looped_ms": None if term is None else _ms(term(0.0)),
      "predicted_looped_ms": round(
          rep.predicted_step_ms - prof_lock + looped_lock, 3),
      "kernels_in_program_ms": round(inprog, 3),
      "outside_kernels_ms": round(1e3 * timed["real"] - inprog, 3),
      "thunks_per_device": round(sum(threads[:2]) / 2, 1),
      "kernel_thunks_per_device": kernel_thunks / 2,
      "kernels": kernels}


def with_parts(row: dict[str, Any]) -> dict[str, Any]:
  """``row`` with its prediction split in two and each part over what it
  prices: the kernel term (``replayed_profiled_ms``, the build's replay
  with the profiled kernels less the replay with zero-time kernels) over
  what the kernels add to the program (paired real - stand-in), and the
  rest (predicted less that term: the stand-in program's price) over the
  stand-in measured beside the real program. A miss of the whole step is
  then one part's or the other's (or both cancelling)."""
  added, standin = row.get("real_minus_standin_ms"), row.get("standin_ms")
  kernels = row.get("replayed_profiled_ms")
  if "error" in row or kernels is None or added is None or not standin:
    return row
  rest = row["predicted_ms"] - kernels
  return {**row, "predicted_rest_ms": round(rest, 3),
          "kernel_term_over_added": round(kernels / max(added, 1e-9), 3),
          "rest_over_standin": round(rest / standin, 3)}


def markdown(rows: Sequence[dict[str, Any]]) -> str:
  """One line per model (ms per step; busier device for the kernels)."""
  head = ["model", "lowered as", "predicted", "real", "kernels profiled",
          "kernels in program", "in program / profiled",
          "real - kernels in program", "stand-in", "real - stand-in",
          "kernels in a loop", "lockstep: profiled / in a loop",
          "thunks / device (kernels)", "lockstep thunks",
          "real / predicted", "real / predicted, loop + thunks",
          "(real - stand-in) / (loop + thunks)",
          "replayed: real / predicted", "replayed: (real - stand-in) / kernels",
          "kernel term / (real - stand-in)", "rest / stand-in"]
  lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
  for r in rows:
    if "error" in r:
      lines.append(f"| {r['model']} | error: {r['error'][:100]} |")
      continue
    ratio = r["kernels_in_program_ms"] / max(r["kernels_profiled_ms"], 1e-9)
    cells = [r["model"], f"`{r['lowered_as']}`", f"{r['predicted_ms']:.2f}",
             f"{r['real_ms']:.2f}", f"{r['kernels_profiled_ms']:.2f}",
             f"{r['kernels_in_program_ms']:.2f}", f"{ratio:.2f}",
             f"{r['outside_kernels_ms']:.2f}",
             "-" if r["standin_ms"] is None else f"{r['standin_ms']:.2f}",
             "-" if r.get("real_minus_standin_ms") is None
             else f"{r['real_minus_standin_ms']:.2f}",
             ("-" if r.get("kernels_looped_ms") is None
              else f"{r['kernels_looped_ms']:.2f}"),
             ("-" if r.get("kernels_looped_lockstep_ms") is None
              else f"{r['kernels_profiled_lockstep_ms']:.2f} /"
              f" {r['kernels_looped_lockstep_ms']:.2f}"),
             f"{r['thunks_per_device']:.0f} ({r['kernel_thunks_per_device']:.0f})",
             str(r.get("lockstep_thunks", "-")),
             f"{r['real_ms'] / r['predicted_ms']:.3f}",
             ("-" if r.get("real_over_thunk_priced") is None
              else f"{r['real_over_thunk_priced']:.3f}"),
             ("-" if r.get("added_over_thunk_priced") is None
              else f"{r['added_over_thunk_priced']:.3f}"),
             ("-" if r.get("real_over_replay_priced") is None
              else f"{r['real_over_replay_priced']:.3f}"),
             ("-" if r.get("added_over_replay_priced") is None
              else f"{r['added_over_replay_priced']:.3f}"),
             ("-" if r.get("kernel_term_over_added") is None
              else f"{r['kernel_term_over_added']:.2f}"),
             ("-" if r.get("rest_over_standin") is None
              else f"{r['rest_over_standin']:.2f}")]
    lines.append("| " + " | ".join(cells) + " |")
  return "\n".join(lines)


def main(args: KernelsArgs, log: Callable[[str], None] = print) -> int:
  """Every model in this process (2 devices); writes the JSON."""
  mesh = jax.sharding.Mesh(np.array(jax.devices()[:2]), ("pipe",))
  load_start = list(os.getloadavg())
  names = list(args.models)
  terms: dict[str, Callable[[float], float]] = {}
  if args.reference and args.reference not in names:
    names.insert(0, args.reference)   # fitted first, on its own
  rows = model_zoo_rows.each_model(
      tuple(names), lambda name: model_row(name, args, mesh, terms), log)
  ref = next((r for r in rows if r["model"] == args.reference
              and "error" not in r), None)
  per_thunk = per_thunk_ms(ref) if ref is not None else None
  fitted = (replay_fit(1e-3 * ref["real_minus_standin_ms"],
                       terms[ref["model"]])
            if ref is not None and ref["model"] in terms
            and ref.get("real_minus_standin_ms") is not None else None)
  rows = [with_parts(with_replay_pricing(with_thunk_pricing(r, per_thunk),
                                         fitted, terms.get(r["model"])))
          for r in rows]
  ratios = [r["kernels_in_program_ms"] / r["kernels_profiled_ms"]
            for r in rows if "error" not in r and r["kernels_profiled_ms"] > 0]
  model_zoo_rows.write_rows(args, rows, markdown, load_start, {
      "median_in_program_over_profiled":
          statistics.median(ratios or [float("nan")]),
      "reference": args.reference,
      "per_thunk_us": None if per_thunk is None else 1e3 * per_thunk,
      "replay_per_thunk_us": None if fitted is None else 1e6 * fitted}, log)
  return 0
