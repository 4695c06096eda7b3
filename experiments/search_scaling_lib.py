"""Search scaling: search time and quality against devices, memory, N, time.

The sweep has four parts, each varying one thing around a base case (every
named placement, wrap-around allowed and forbidden, no memory limit):

* ``devices``: the number of devices (4 .. 64), no memory limit;
* ``memory``: the memory case (``tight``, ``fast``, ``loose`` as in
  ``search_cases``) at a few device counts;
* ``microbatches``: the number of micro-batches N (8 .. 1024). N does not
  enter the repetend search; it changes the warmup/cooldown completion and
  the unrolling, so this part searches with completion once (its
  ``search_seconds`` include the warmup/cooldown compaction) and measures, for
  every N, the unroll time (the warmup/cooldown templates, or a CP-SAT
  completion of every action when N is below ``2 * max offset``;
  ``uses_templates`` and ``source`` say which schedule ``unroll`` returned),
  the validation time and the makespan against its lower bound;
* ``time_limit``: short CP-SAT budgets on a hard case (tight memory): the
  best period found so far and the proven gap ``(P - P_lb) / P``.

Every search records the period, its proven lower bound ``P_lb``, the gap,
the CP-SAT status (``OPTIMAL``: the period is proven minimal), the latency
of one micro-batch and its status, the time until the period was found and
the whole search time. Outside the ``microbatches`` part the search stops
after the repetend (``complete=False``: no warmup/cooldown compaction, whose
cost is measured by the ``microbatches`` part) unless ``complete`` is set.

The memory limits of ``tight`` and ``fast`` are found once per placement and
device count with wrap-around forbidden (Tessel's rule), so both variants run
under the same limit (a no-wrap schedule is also a wrap schedule).

``run(args)`` writes ``<output_dir>/run_{hash}.json`` after every case and
returns the results, with the sweep's own wall time. Nothing here reads
flags.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from typing import Any, NamedTuple

from experiments import progress, runs, search_cases_lib, search_lib
from tessel_jax import placements, simulate
from tessel_jax.graph import BlockGraph, PlacementError
from tessel_jax.schedule import Schedule
from tessel_jax.search import search_repetend

RUNNER = "search_scaling"
PARTS = ("devices", "memory", "microbatches", "time_limit")
MEMORY_CASES = ("tight", "fast", "loose")


class ScalingArgs(NamedTuple):
  """Everything ``search_scaling_lib.run`` needs; see the flags for meanings."""

  parts: tuple[str, ...] = PARTS
  placements: tuple[str, ...] | None = None
  wraps: tuple[bool, ...] = (True, False)
  time_limit: float = 1.0
  complete: bool = False
  devices: tuple[int, ...] = (4, 8, 16, 32, 64)
  memories: tuple[str, ...] = MEMORY_CASES
  memory_devices: tuple[int, ...] = (4, 8)
  memory_time_limit: float = 10.0
  microbatches: tuple[int, ...] = (8, 32, 128, 512, 1024)
  microbatch_devices: tuple[int, ...] = (8,)
  time_limits: tuple[float, ...] = (0.25, 1.0, 2.0)
  time_limit_devices: tuple[int, ...] = (8,)
  time_limit_memory: str = "tight"
  seed: int = 0
  workers: int = 1
  output_dir: str = "results/search_scaling"


def check_args(args: ScalingArgs) -> None:
  """Raises ValueError naming a bad argument (and what is allowed)."""
  bad = [p for p in args.parts if p not in PARTS]
  if bad or not args.parts:
    raise ValueError(f"parts {list(args.parts)}: choose from {list(PARTS)}")
  bad = [m for m in args.memories if m not in MEMORY_CASES]
  if bad or not args.memories:
    raise ValueError(f"memories {list(args.memories)}: choose from"
                     f" {list(MEMORY_CASES)}")
  if args.time_limit_memory not in MEMORY_CASES:
    raise ValueError(f"time_limit_memory {args.time_limit_memory!r}: choose"
                     f" from {list(MEMORY_CASES)}")
  if not args.wraps:
    raise ValueError("wraps is empty: give True (wrap-around) and/or False")
  counts = (args.devices + args.memory_devices + args.microbatch_devices
            + args.time_limit_devices)
  if any(d < 1 for d in counts):
    raise ValueError(f"device counts must be >= 1, got {sorted(set(counts))}")
  if any(n < 1 for n in args.microbatches):
    raise ValueError(
        f"microbatches must be >= 1, got {list(args.microbatches)}")
  limits = (args.time_limit, args.memory_time_limit) + tuple(args.time_limits)
  if any(t <= 0 for t in limits):
    raise ValueError(f"time limits must be > 0, got {list(limits)}")
  if args.workers < 1:
    raise ValueError(f"workers must be >= 1, got {args.workers}")
  search_cases_lib.placement_names(args)  # unknown names raise here


def gap(period: int, lower_bound: int) -> float:
  """Proven optimality gap of a period: ``(P - P_lb) / P``."""
  return round((period - lower_bound) / period, 4) if period else 0.0


def _error(e: BaseException) -> str:
  return f"{type(e).__name__}: {e}"


class _Sweep:
  """State of one run: caches of graphs, memory limits and searches."""

  def __init__(self, args: ScalingArgs, log: Callable[[str], None]):
    self.args = args
    self.log = log
    self.t0 = time.perf_counter()
    self.cpu0 = time.process_time()
    self.results = runs.new_results(RUNNER, args)
    self.results.update({"cases": [], "skipped": [], "wall_seconds": 0.0,
                         "cpu_seconds": 0.0,
                         "load_average_start": os.getloadavg()})
    self._graphs: dict[tuple[str, int], BlockGraph | str] = {}
    self._limits: dict[tuple[str, int, str], dict[str, Any]] = {}
    self._searches: dict[tuple, tuple[Schedule | None, dict[str, Any]]] = {}
    self.eta = progress.Eta(1)

  # --- caches ---------------------------------------------------------------

  def graph(self, name: str, devices: int) -> BlockGraph | None:
    """The placement, or None (recorded as skipped) if it does not exist."""
    key = (name, devices)
    if key not in self._graphs:
      try:
        self._graphs[key] = placements.get(name, devices)
      except (PlacementError, ValueError, NotImplementedError) as e:
        self._graphs[key] = str(e)
        self.results["skipped"].append(
            {"placement": name, "devices": devices, "reason": str(e)})
    graph = self._graphs[key]
    return graph if isinstance(graph, BlockGraph) else None

  def memory(self, name: str, graph: BlockGraph, case: str) -> dict[str, Any]:
    """``memory_case``/``memory_limit`` (and the time to find it) of a case."""
    key = (name, graph.num_devices, case)
    if key not in self._limits:
      args = self.args
      rows = search_cases_lib.memory_cases(
          graph, (case,), allow_wrap=False,
          time_limit_s=args.memory_time_limit, seed=args.seed,
          workers=args.workers)
      self._limits[key] = rows[0]
    return dict(self._limits[key])

  def search(self, graph: BlockGraph, limit: int | None, wrap: bool,
             time_limit: float, complete: bool
             ) -> tuple[Schedule | None, dict[str, Any]]:
    """Searches once per distinct case; returns the schedule and figures."""
    key = (graph.name, limit, wrap, time_limit, complete)
    if key not in self._searches:
      args = self.args
      figures: dict[str, Any] = {}
      schedule = None
      t0 = time.perf_counter()
      try:
        schedule = search_repetend(
            graph, limit, allow_wrap=wrap, time_limit_s=time_limit,
            seed=args.seed, num_workers=args.workers, complete=complete)
      except Exception as e:  # pylint: disable=broad-except
        figures["error"] = _error(e)
      figures["wall_seconds"] = round(time.perf_counter() - t0, 3)
      if schedule is not None:
        figures.update(schedule_figures(schedule))
      self._searches[key] = (schedule, figures)
    schedule, figures = self._searches[key]
    return schedule, dict(figures)

  # --- cases ----------------------------------------------------------------

  def case(self, part: str, name: str, devices: int, memory_case: str,
           wrap: bool, time_limit: float, complete: bool,
           extra: Callable[[Schedule], dict[str, Any]] | None = None) -> None:
    """Runs and records one case (skipped when the placement lacks it)."""
    graph = self.graph(name, devices)
    if graph is None:
      self.eta.skip()
      return
    row: dict[str, Any] = {
        "part": part, "placement": name, "graph": graph.name,
        "devices": devices, "num_blocks": graph.num_blocks,
        "allow_wrap": wrap, "time_limit": time_limit, "complete": complete,
    }
    row.update(self.memory(name, graph, memory_case))
    if "error" not in row:
      schedule, figures = self.search(graph, row["memory_limit"], wrap,
                                      time_limit, complete)
      row.update(figures)
      if schedule is not None and extra is not None:
        row.update(extra(schedule))
    self.results["cases"].append(row)
    self.log(self.eta.finished(progress_line(row,
                                             time.perf_counter() - self.t0)))
    self.save()

  def save(self) -> None:
    self.results["wall_seconds"] = round(time.perf_counter() - self.t0, 2)
    self.results["cpu_seconds"] = round(time.process_time() - self.cpu0, 2)
    self.results["load_average_end"] = os.getloadavg()
    runs.write(self.results)


def schedule_figures(schedule: Schedule) -> dict[str, Any]:
  """Period, bounds, gap, statuses and times of a searched schedule."""
  graph = schedule.graph
  return {
      "period": schedule.period,
      "period_lower_bound": schedule.period_lower_bound,
      "period_resource_bound": simulate.lower_bound_period(graph),
      "gap": gap(schedule.period, schedule.period_lower_bound),
      "status": schedule.status,
      "latency": schedule.latency,
      "latency_lower_bound": schedule.latency_lower_bound,
      "latency_status": schedule.latency_status,
      "repetend_microbatches": schedule.repetend.microbatches,
      "period_seconds": round(schedule.period_seconds, 3),
      "search_seconds": round(schedule.search_seconds, 3),
  }


def unroll_figures(schedule: Schedule,
                   microbatches: tuple[int, ...]) -> dict[str, Any]:
  """Unroll time, validation time and quality of ``schedule`` for each N."""
  rows = []
  for n in microbatches:
    row: dict[str, Any] = {"num_microbatches": n}
    try:
      t0 = time.perf_counter()
      unrolled = schedule.unroll(n)
      row["unroll_seconds"] = round(time.perf_counter() - t0, 4)
      # After the timing: repetend_window may unroll again.
      row["uses_templates"] = (
          search_lib.repetend_window(schedule, n) is not None)
      row["source"] = unrolled.source
      t0 = time.perf_counter()
      figures = search_lib.measure(unrolled)  # validates, then simulates
      row["validate_seconds"] = round(time.perf_counter() - t0, 4)
      for key in ("makespan", "makespan_lower_bound", "makespan_ratio",
                  "bubble_ratio", "max_peak_memory"):
        row[key] = figures[key]
    except Exception as e:  # pylint: disable=broad-except
      row["error"] = _error(e)
    rows.append(row)
  return {"unroll": rows}


def run(args: ScalingArgs,
        log: Callable[[str], None] = print) -> dict[str, Any]:
  """Runs the sweep; writes ``run_{hash}.json`` after every case.

  Args:
    args: The sweep.
    log: Receives one progress line per case.

  Returns:
    ``{"runner", "args", "environment", "output", "cases", "skipped",
    "wall_seconds", "cpu_seconds", "load_average_start",
    "load_average_end"}`` (the sweep's own wall and CPU seconds, and the
    machine's load, since a shared machine slows the wall clock); ``cases`` has one dict per (part, placement, devices,
    memory case, wrap, time limit) with the figures of ``schedule_figures``
    (or ``error``), plus ``unroll`` (one row per N) in the ``microbatches``
    part.

  Raises:
    ValueError: for bad arguments (see ``check_args``).
  """
  check_args(args)
  sweep = _Sweep(args, log)
  names = search_cases_lib.placement_names(args)
  sweep.eta = progress.Eta(len(names) * case_count(args))
  for part in args.parts:
    for name in names:
      if part == "devices":
        for d in args.devices:
          for wrap in args.wraps:
            sweep.case(part, name, d, "loose", wrap, args.time_limit,
                       args.complete)
      elif part == "memory":
        for d in args.memory_devices:
          for memory in args.memories:
            for wrap in args.wraps:
              sweep.case(part, name, d, memory, wrap, args.time_limit,
                         args.complete)
      elif part == "microbatches":
        for d in args.microbatch_devices:
          for wrap in args.wraps:
            sweep.case(part, name, d, "loose", wrap, args.time_limit, True,
                       extra=lambda s: unroll_figures(s, args.microbatches))
      else:
        for d in args.time_limit_devices:
          for wrap in args.wraps:
            for limit in args.time_limits:
              sweep.case(part, name, d, args.time_limit_memory, wrap, limit,
                         args.complete)
  sweep.save()
  return sweep.results


def case_count(args: ScalingArgs) -> int:
  """Cases per placement in the sweep (before skipping missing ones)."""
  wraps = len(args.wraps)
  per_part = {
      "devices": len(args.devices) * wraps,
      "memory": len(args.memory_devices) * len(args.memories) * wraps,
      "microbatches": len(args.microbatch_devices) * wraps,
  }
  other = len(args.time_limit_devices) * wraps * len(args.time_limits)
  return sum(per_part.get(part, other) for part in args.parts)


def progress_line(row: dict[str, Any], elapsed: float) -> str:
  """One line per case."""
  head = (f"[{elapsed:7.1f}s] {row['part']:<12} {row['placement']:>13}"
          f" d{row['devices']:<2} {row['memory_case']:<5}"
          f" {'wrap' if row['allow_wrap'] else 'nowrap':<6}"
          f" T={row['time_limit']:g}")
  if "error" in row:
    return f"{head} ERROR {row['error']}"
  text = (f"{head} P={row['period']} lb={row['period_lower_bound']}"
          f" gap={100 * row['gap']:.1f}% {row['status']}"
          f" search {row['search_seconds']:.2f}s")
  for u in row.get("unroll", ()):
    if "error" in u:
      text += f" | N={u['num_microbatches']} error"
    else:
      text += (f" | N={u['num_microbatches']} {u['unroll_seconds']:.2f}s"
               f" x{u['makespan_ratio']:.3f}")
  return text


def summary(results: dict[str, Any]) -> str:
  """Headline lines: per part, the slowest search and the largest gap."""
  load = results.get("load_average_end", (0.0,))[0]
  lines = [f"search_scaling: {len(results['cases'])} cases in"
           f" {results['wall_seconds']:.1f} s wall,"
           f" {results.get('cpu_seconds', 0.0):.1f} s CPU (load average"
           f" {load:.1f} on {os.cpu_count()} cores) ({results['output']})"]
  for part in PARTS:
    rows = [c for c in results["cases"] if c["part"] == part]
    if not rows:
      continue
    ok = [c for c in rows if "error" not in c]
    errors = len(rows) - len(ok)
    text = f"  {part}: {len(rows)} cases, {errors} errors"
    if ok:
      slow = max(ok, key=lambda c: c["search_seconds"])
      worst = max(ok, key=lambda c: c["gap"])
      optimal = sum(1 for c in ok if c["status"] == "OPTIMAL")
      text += (f", {optimal}/{len(ok)} periods proven optimal; slowest"
               f" {slow['search_seconds']:.2f} s ({_label(slow)}); largest"
               f" gap {100 * worst['gap']:.1f}% ({_label(worst)})")
    lines.append(text)
    if part == "microbatches":
      units = [u for c in ok for u in c.get("unroll", ()) if "error" not in u]
      if units:
        slow = max(units, key=lambda u: u["unroll_seconds"])
        lines.append(f"    slowest unroll {slow['unroll_seconds']:.2f} s"
                     f" (N={slow['num_microbatches']}); worst makespan ratio"
                     f" {max(u['makespan_ratio'] for u in units):.3f}")
  return "\n".join(lines)


def _label(row: dict[str, Any]) -> str:
  return (f"{row['placement']} d{row['devices']} {row['memory_case']}"
          f" {'wrap' if row['allow_wrap'] else 'nowrap'}"
          f" T={row['time_limit']:g}")
