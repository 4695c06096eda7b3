"""``placement="auto"`` on the README's GPT (or a model-zoo model): the
choice, predicted against measured (no flags here; see
``auto_plan_args``).

``run(args)`` times the choice cold (a fresh measurement and schedule
cache) and warm (the same caches, a new ``ScheduledFunction``; the priced
plans are remembered in the process), with its phase split, then for each
memory limit lowers the chosen plan and the other candidates (all of them,
or the ``measure_top`` fastest predicted ones), compiles each and times
them in interleaved rounds (shuffled order per round, wall and process CPU
seconds) beside the plain step (``jit(value_and_grad(fn))`` on one device,
the reference that makes absolute times comparable between processes and
sessions), and records whether the chosen plan measures within 5% of the
fastest measured candidate that fits the limit; a candidate that lowers to
the same program as one before it (a search under a limit that does not
bind) is not timed again (``same_program_as``). A control row (the chosen
plan compiled again, ``--control``) gives each case's noise floor; the
summary (``auto_plan_summary``) also replays a measured tie-break.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import random
import statistics
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any, NamedTuple

import jax

import tessel_jax as tj
from tessel_jax import frontier_memo, plans

from experiments import train_lib
from experiments.auto_plan_summary import summarise

RUNNER = "auto_plan"


class AutoPlanArgs(NamedTuple):
  """Everything ``auto_plan_lib.run`` needs; see the flags for meanings."""

  devices: int = 4
  microbatches: int = 8
  microbatch_size: int = 4
  layers: int = 4
  d_model: int = 64
  heads: int = 4
  seq: int = 32
  blocks: int = 5
  memory_limits: tuple[str, ...] = ("none",)
  placements: tuple[str, ...] | None = None
  measure_top: int = 8
  repeats: int = 5
  time_limit: float = 10.0
  cache_dir: str | None = None
  output: str | None = "out/auto_plan.json"
  model: str = "readme_gpt"
  record_searches: str | None = None
  control: bool = True
  price_stash: bool = True


def parse_limit(text: str) -> int | None:
  """``none`` -> None; ``2MiB``/``512KiB``/``123`` -> bytes."""
  t = text.strip()
  if t.lower() == "none":
    return None
  for suffix, size in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
    if t.endswith(suffix):
      return int(float(t[:-len(suffix)]) * size)
  return int(t)


#: ``--memory_limits=between:F``: F of the way from the smallest plan's
#: peak to the unlimited choice's (0: the smallest plan, 1: the choice).
BETWEEN = "between:"


def workspace_gap(priced: Sequence[Any]) -> int:
  """The most a full build's peak exceeded its screened peak over the
  plans of ``priced`` this process priced both ways (``plans`` memo; 0:
  none): the kernel workspace a screened price leaves out."""
  shown = {p.candidate for p in priced}
  full: dict[Any, int] = {}
  screened: dict[Any, int] = {}
  for e in frontier_memo.entries():
    if e.candidate not in shown:
      continue
    if e.screen is False:
      full[e.program_key, e.candidate] = e.plan.peak_bytes
    elif e.plan.screened:
      screened[e.program_key, e.candidate] = e.plan.peak_bytes
  return max([full[k] - screened[k] for k in full.keys() & screened.keys()]
             + [0])


def floor_peak(priced: Sequence[Any]) -> int:
  """The smallest peak a plan of ``priced`` can be expected to reach in
  full. A screened price leaves out the kernel workspace (known once
  compiled), so a floor at a screened peak gave a limit no plan fits
  (eqx_transformer, 8 devices, session 33: between:0.33 = 398,187 B, below
  every full build). A screened peak counts with the largest workspace
  gap seen (:func:`workspace_gap`), as does a classic schedule priced on a
  screened build; a full build's peak as it is."""
  on_screened = {p.candidate for p in priced if p.screened}
  gap = workspace_gap(priced)
  return min(p.peak_bytes + (gap if plans.base_of(p.candidate) in on_screened
                             else 0) for p in priced)


def resolve_limit(text: str, unlimited: Any) -> int | None:
  """:func:`parse_limit`, or for ``between:F`` (``0 <= F <= 1``) the bytes
  F of the way from the smallest peak expected in full (:func:`floor_peak`)
  to the peak of ``unlimited`` (the choice without a limit,
  ``plans.AutoChoice``): limits that bind, on any program, without knowing
  its sizes first. A limit no plan fits is recorded with the error."""
  if not text.strip().startswith(BETWEEN):
    return parse_limit(text)
  frac = float(text.strip()[len(BETWEEN):])
  if not 0.0 <= frac <= 1.0:
    raise ValueError(f"memory limit {text!r}: F must be in [0, 1]")
  low = floor_peak(unlimited.frontier.plans)
  high = max(low, unlimited.winner.peak_bytes)
  return int(low + frac * (high - low))


def gpt(args: AutoPlanArgs) -> tuple[Callable[..., Any], Any, Any]:
  """The README main job's GPT: ``(loss_fn, params, batch)``; the loss has
  ``blocks - 1`` ``tj.boundary`` markers (plans with another block count
  are cut automatically)."""
  data = train_lib.CharData(train_lib.corpus(), args.seq, 0)
  params = train_lib.init_params(jax.random.PRNGKey(0), data.vocab,
                                 args.d_model, args.layers, args.seq)
  loss_fn = train_lib.make_loss_fn(args.blocks, args.layers, args.heads)
  batch = data.batch(args.microbatches * args.microbatch_size)
  return loss_fn, params, batch


def program(args: AutoPlanArgs) -> tuple[Callable[..., Any], Any, Any, bool]:
  """``(fn, params, batch, has_aux)`` of ``args.model``: the README GPT
  (:func:`gpt`) or a model-zoo model with ``microbatches x
  microbatch_size`` rows (``experiments.frontier_program.load``)."""
  if args.model == "readme_gpt":
    return gpt(args) + (False,)
  from experiments import frontier_program  # pylint: disable=import-outside-toplevel
  return frontier_program.load(args.model,
                               args.microbatches * args.microbatch_size)


def interleaved_steps(compiled: dict[int, Callable[..., Any]], params: Any,
                      batch: Any, repeats: int, seed: int = 0,
                      rounds: dict[int, list[tuple[float, float]]] | None
                      = None) -> dict[int, tuple[float, float]]:
  """Median ``(wall, process CPU)`` seconds per step of each program, timed
  in ``repeats`` rounds that run every program once in a shuffled order
  (a busy neighbour slows a round, not one program); ``rounds`` (when
  given) gets each program's ``(wall, CPU)`` per round, for paired
  ratios."""
  rng = random.Random(seed)
  for run in compiled.values():
    jax.block_until_ready(run(params, batch))   # warm-up
  wall: dict[int, list[float]] = {i: [] for i in compiled}
  cpu: dict[int, list[float]] = {i: [] for i in compiled}
  order = list(compiled)
  for _ in range(repeats):
    rng.shuffle(order)
    for i in order:
      t0, c0 = time.perf_counter(), time.process_time()
      jax.block_until_ready(compiled[i](params, batch))
      wall[i].append(time.perf_counter() - t0)
      cpu[i].append(time.process_time() - c0)
  if rounds is not None:
    rounds.update({i: list(zip(wall[i], cpu[i])) for i in compiled})
  return {i: (statistics.median(wall[i]), statistics.median(cpu[i]))
          for i in compiled}


class PhaseTimes(logging.Handler):
  """Context manager: wall seconds per build phase (``tessel_jax.progress``
  laps: trace, cut, kernels, profile, search, ...) summed over every plan
  built inside it, and the process CPU seconds since the previous progress
  line, by the phase that line ends (``cpu``; what runs between builds
  counts towards the next build's ``trace``)."""

  def __init__(self) -> None:
    super().__init__(logging.INFO)
    self.seconds: dict[str, float] = {}
    self.cpu: dict[str, float] = {}
    self._level = logging.NOTSET
    self._cpu0 = time.process_time()

  def emit(self, record: logging.LogRecord) -> None:
    args = record.args
    now = time.process_time()
    if (isinstance(args, tuple) and len(args) == 4 and
        str(record.msg).startswith("schedule(%r): %s %.2f s")):
      phase = str(args[1])
      self.seconds[phase] = self.seconds.get(phase, 0.0) + float(args[2])
      self.cpu[phase] = self.cpu.get(phase, 0.0) + now - self._cpu0
    self._cpu0 = now

  def __enter__(self) -> "PhaseTimes":
    self._cpu0 = time.process_time()
    logger = logging.getLogger("tessel_jax")
    self._level = logger.level
    logger.setLevel(logging.INFO)
    logger.addHandler(self)
    return self

  def __exit__(self, *exc: Any) -> None:
    logger = logging.getLogger("tessel_jax")
    logger.removeHandler(self)
    logger.setLevel(self._level)


def time_choice(fn: Any, mesh: Any, params: Any, batch: Any,
                args: AutoPlanArgs, cache: str, limit: int | None,
                has_aux: bool = False) -> tuple[Any, float]:
  """``(step, seconds)`` of building ``placement="auto"`` (choice included,
  compile excluded)."""
  step, secs, _ = time_choice_phases(fn, mesh, params, batch, args, cache,
                                     limit, has_aux)
  return step, secs


def time_choice_phases(fn: Any, mesh: Any, params: Any, batch: Any,
                       args: AutoPlanArgs, cache: str, limit: int | None,
                       has_aux: bool = False
                       ) -> tuple[Any, float, dict[str, float]]:
  """``(step, wall seconds, split)`` of building ``placement="auto"``; the
  split has the summed build phases, ``other`` (the rest of the wall time:
  tracing for the markers, baseline replays, choosing) and ``cpu`` (process
  CPU seconds)."""
  step = tj.schedule(fn, mesh=mesh, placement="auto",
                     num_microbatches=args.microbatches, memory_limit=limit,
                     cache_dir=cache, solver_time_limit_s=args.time_limit,
                     cost="calibrated", optimizer_slots=2, has_aux=has_aux)
  with PhaseTimes() as phases:
    t0, c0 = time.perf_counter(), time.process_time()
    step.build(params, batch)
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
  split = {k: round(v, 2) for k, v in phases.seconds.items()}
  split["other"] = round(wall - sum(phases.seconds.values()), 2)
  split["cpu"] = round(cpu, 2)
  split["cpu_split"] = {k: round(v, 2) for k, v in phases.cpu.items()}
  split["cpu_split"]["other"] = round(cpu - sum(phases.cpu.values()), 2)
  return step, wall, split


def measure_candidates(step: Any, fn: Any, mesh: Any, params: Any, batch: Any,
                       args: AutoPlanArgs, cache: str,
                       log: Callable[[str], None],
                       rows: list[dict[str, Any]],
                       has_aux: bool = False) -> list[dict[str, Any]]:
  """Compiles and times the chosen plan and the other candidates (the
  chosen one first), appending to ``rows`` as they are measured; the
  plain step (:func:`reference_program`) is timed in the same rounds, as
  the last row (``"reference": True``), and every row gets its step over
  the reference's (``x_reference``, wall and CPU), comparable between
  processes and sessions."""
  choice = step.choice
  order = to_measure(choice.frontier.plans, choice.winner,
                     choice.memory_limit, args.measure_top)
  ff = plans.FrontierFunction(fn, mesh=mesh, pipe_axis="pipe", mode="train",
                              cache_dir=cache, cost="calibrated",
                              solver_time_limit_s=args.time_limit,
                              optimizer_slots=2, has_aux=has_aux)
  markers = plans.marker_blocks(fn, params, batch, {"has_aux": has_aux})
  compiled: dict[int, Callable[..., Any]] = {}
  new_rows = []
  programs: dict[str, str] = {}  # lowered text -> the first row's label
  for p in order:
    row = {"label": p.label, "predicted_ms": round(p.step, 4),
           "peak_bytes": p.peak_bytes, "source": p.source,
           "chosen": p is choice.winner}
    try:
      t0, c0 = time.perf_counter(), time.process_time()
      cand = ff.step_for(p.candidate, markers)
      lowered = cand.lower(params, batch)
      same = same_program(programs, lowered.as_text(), p.label)
      if same is not None:
        # One program, one row: timed twice, the faster of its two noisy
        # medians would be "the fastest candidate".
        row["same_program_as"] = same
      else:
        compiled[len(new_rows)] = lowered.compile()
      # What timing it in a measured tie-break would cost first.
      row["build_compile_s"] = [round(time.perf_counter() - t0, 2),
                                round(time.process_time() - c0, 2)]
    except Exception as err:  # pylint: disable=broad-except
      row["error"] = f"{type(err).__name__}: {str(err)[:200]}"
    new_rows.append(row)
  if args.control and 0 in compiled:
    compiled[len(new_rows)], again = control_program(
        ff, choice.winner.candidate, markers, params, batch, compiled[0])
    new_rows.append({"label": f"{choice.winner.label} {CONTROL}",
                     "control": True, "chosen": False,
                     "same_executable": again})
  compiled[len(new_rows)] = reference_program(fn, params, batch, has_aux)
  new_rows.append({"label": REFERENCE, "reference": True, "chosen": False})
  _time_rows(compiled, new_rows, params, batch, args.repeats)
  for row in new_rows:
    rows.append(row)
    if "same_program_as" in row:
      log(f"    {row['label']:<42} predicted {row['predicted_ms']:8.3f} ms"
          f"  not timed: the same program as {row['same_program_as']}")
      continue
    log(f"  {'*' if row['chosen'] else ' '} {row['label']:<42} predicted"
        f" {row.get('predicted_ms', float('nan')):8.3f} ms  measured"
        f" {row.get('measured_ms', float('nan')):8.3f} ms (CPU"
        f" {row.get('measured_cpu_ms', float('nan')):8.3f} ms) x reference"
        f" {row.get('x_reference', [float('nan')] * 2)[0]:6.3f}")
  return rows


def same_program(seen: dict[str, str], text: str, label: str) -> str | None:
  """The label of an earlier candidate lowered to the same program text as
  ``label`` (None: a new program, remembered in ``seen``). README GPT, 4
  devices: where the unlimited search's plan fits the limit, the search
  under the limit gives the same schedule (the same prediction and peak);
  quiet session 32 timed it twice, 35.16 and 34.03 ms, and the chosen
  plan's 1.051 wall against the faster copy was the case's one miss."""
  if text in seen:
    return seen[text]
  seen[text] = label
  return None


#: The label suffix of the control row of ``measure_candidates``.
CONTROL = "(control: the chosen plan again)"


def control_program(ff: Any, cand: Any, markers: int | None, params: Any,
                    batch: Any, first: Callable[..., Any]
                    ) -> tuple[Callable[..., Any], bool]:
  """The chosen plan built, lowered and compiled a second time, timed as
  one more row (``"control": True``, never a candidate): its paired ratio
  to the chosen row is the noise floor of the comparison (README GPT, 4
  devices, quiet, session 30: one plan measured 0.854 and 0.736 x the
  plain step in two cases of one process). Returns ``(program, whether
  XLA gave back the same executable)``."""
  again = ff.step_for(cand, markers).lower(params, batch).compile()
  return again, again is first


#: The label of the reference row of ``measure_candidates``.
REFERENCE = "reference: jit(value_and_grad(fn)) on device 0"


def reference_program(fn: Callable[..., Any], params: Any, batch: Any,
                      has_aux: bool = False) -> Callable[..., Any]:
  """The plain step, ``jax.jit(jax.value_and_grad(fn))`` compiled for the
  first device of this process: its time moves with the machine and the
  process (threads, load), not with the plans."""
  return jax.jit(jax.value_and_grad(fn, has_aux=has_aux)).lower(
      params, batch).compile()


def _time_rows(compiled: dict[int, Callable[..., Any]],
               rows: list[dict[str, Any]], params: Any, batch: Any,
               repeats: int) -> None:
  """Times ``compiled`` (:func:`interleaved_steps`) into ``rows`` (by
  index; the last row is the reference): medians, per-round times and
  ``x_reference``."""
  per_round: dict[int, list[tuple[float, float]]] = {}
  try:
    times = interleaved_steps(compiled, params, batch, repeats,
                              rounds=per_round)
  except Exception as err:  # pylint: disable=broad-except
    times = {}
    for row in rows:
      row.setdefault("error", f"{type(err).__name__}: {str(err)[:200]}")
  ref = times.get(len(rows) - 1)
  for i, (wall, cpu) in times.items():
    rows[i]["measured_ms"] = round(1e3 * wall, 4)
    rows[i]["measured_cpu_ms"] = round(1e3 * cpu, 4)
    rows[i]["rounds_ms"] = [[round(1e3 * w, 3), round(1e3 * c, 3)]
                            for w, c in per_round.get(i, [])]
    if ref is not None:
      rows[i]["x_reference"] = [round(wall / ref[0], 4),
                                round(cpu / ref[1], 4)]


def to_measure(priced: Any, winner: Any, limit: int | None, top: int
               ) -> list[Any]:
  """The plans to time: the chosen one first, then the ``top`` fastest
  predicted plans that fit (0: all), then the fastest predicted fitting
  plan of each placement not among them yet (so a placement the
  prediction ranks low is still measured against the choice)."""
  fits = sorted((p for p in priced if limit is None or p.peak_bytes <= limit),
                key=lambda p: p.step)
  order = [winner] + [p for p in (fits[:top] if top else fits)
                      if p is not winner]
  seen = {p.candidate.placement for p in order}
  for p in fits:
    if p.candidate.placement not in seen:
      seen.add(p.candidate.placement)
      order.append(p)
  return order


@contextlib.contextmanager
def record_searches(args: AutoPlanArgs) -> Iterator[list[dict[str, Any]]]:
  """With ``args.record_searches``: every schedule search run inside, as
  ``{graph, limit, time_limit_s, microbatches}`` (the input of
  ``experiments.auto_plan_unroll --searches``)."""
  out: list[dict[str, Any]] = []
  if not args.record_searches:
    yield out
    return
  from tessel_jax import step_schedule  # pylint: disable=import-outside-toplevel
  search = step_schedule._search  # pylint: disable=protected-access

  def recorded(step: Any, graph: Any, limit: Any, unit: int) -> Any:
    out.append({"graph": graph.to_dict(), "limit": limit,
                "time_limit_s": step.solver_time_limit_s,
                "microbatches": args.microbatches * graph.num_devices
                                // args.devices})
    return search(step, graph, limit, unit)
  step_schedule._search = recorded  # pylint: disable=protected-access
  try:
    yield out
  finally:
    step_schedule._search = search  # pylint: disable=protected-access


def run(args: AutoPlanArgs, log: Callable[[str], None] = print,
        save: Callable[[dict[str, Any]], None] = lambda _r: None
        ) -> dict[str, Any]:
  """Runs the benchmark; returns the record (see the module docstring).
  ``save`` gets the record after every measured plan."""
  mesh = jax.make_mesh((args.devices,), ("pipe",))
  fn, params, batch, has_aux = program(args)
  if args.placements:
    plans.DEFAULT_PLACEMENTS = tuple(args.placements)
  from tessel_jax import auto as _auto  # pylint: disable=import-outside-toplevel
  _auto.PRICE_STASH = args.price_stash
  cache = args.cache_dir or tempfile.mkdtemp(prefix="auto_plan_cache_")
  record: dict[str, Any] = {"runner": RUNNER, "args": args._asdict(),
                            "jax": jax.__version__, "cases": []}
  with record_searches(args) as searches:
    cold_step, cold, cold_split = time_choice_phases(
        fn, mesh, params, batch, args, cache, None, has_aux)
  if args.record_searches:
    write(searches, args.record_searches)  # experiments.auto_plan_unroll
  step, warm, warm_split = time_choice_phases(fn, mesh, params, batch, args,
                                              cache, None, has_aux)
  record.update(choose_seconds_cold=round(cold, 2),
                choose_seconds_warm=round(warm, 2),
                choose_split_cold=cold_split, choose_split_warm=warm_split,
                plans_priced=len(step.choice.frontier.plans),
                cold_full_builds=[  # the plans not left at a screened price
                    p.label for p in cold_step.choice.frontier.plans
                    if not p.screened and p.candidate.plan is None],
                load_average=[round(x, 2) for x in os.getloadavg()])
  save(record)
  log(f"choice: cold {cold:.1f} s (CPU {cold_split['cpu']:.1f} s), warm"
      f" {warm:.1f} s (CPU {warm_split['cpu']:.1f} s),"
      f" {len(step.choice.frontier.plans)} plans priced; load"
      f" {os.getloadavg()[0]:.1f}")
  log(f"  cold split: {cold_split}")
  log(f"  warm split: {warm_split}")
  for text in args.memory_limits:
    limit = resolve_limit(text, cold_step.choice)
    if text.startswith(BETWEEN):
      log(f"memory limit {text} = {limit} bytes")
    try:
      step, secs = time_choice(fn, mesh, params, batch, args, cache, limit,
                               has_aux)
    except tj.TesselError as err:
      record["cases"].append({"memory_limit": text,
                              "memory_limit_bytes": limit,
                              "error": str(err)})
      save(record)  # the last case may be this one
      log(f"memory limit {text}: {err}")
      continue
    log(f"memory limit {text}: {step.choice.describe()}")
    case: dict[str, Any] = {"memory_limit": text,
                            "memory_limit_bytes": limit,
                            "choose_seconds": round(secs, 2),
                            "frontier": step.choice.frontier.to_dict(),
                            "candidates": []}
    record["cases"].append(case)

    def progress(line: str, case=case) -> None:
      log(line)
      case.update(summarise(case["candidates"]))
      save(record)  # a run cut short keeps what it measured
    measure_candidates(step, fn, mesh, params, batch, args, cache, progress,
                       case["candidates"], has_aux)
    got = summarise(case["candidates"])
    log(f"  chosen / fastest: {got.get('chosen_over_fastest')} wall,"
        f" {got.get('chosen_over_fastest_cpu')} CPU (medians); paired per"
        f" round (wall, CPU): {got.get('paired_wall_cpu')}; chosen over"
        f" its control (noise floor): {got.get('chosen_over_control_paired')}"
        f"; measured tie-break {got.get('tiebreak_pick')} over best"
        f" {got.get('tiebreak_over_best_paired')} for"
        f" {got.get('tiebreak_cost_s')} s; plain step"
        f" (wall, CPU ms) {got.get('reference_ms')}; load"
        f" {os.getloadavg()[0]:.1f}")
  return record


def write(record: dict[str, Any], path: str | None) -> None:
  if path:
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
      f.write(json.dumps(record, indent=1, default=str))


def main(args: AutoPlanArgs) -> int:
  run(args, log=lambda s: print(s, flush=True),
      save=lambda r: write(r, args.output))
  if args.output:
    print(f"results: {args.output}")
  return 0


__all__ = ["AutoPlanArgs", "main", "run"]
