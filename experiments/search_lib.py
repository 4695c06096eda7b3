"""Search one placement, check it, measure it, print it, save it.

``run(args)`` does the work of ``python -m experiments.search`` and returns
the result as a dict; ``main(args)`` adds the printing and the exit code.
Nothing here reads flags.
"""

from __future__ import annotations

import dataclasses

import sys
from typing import Any, NamedTuple, TextIO

from tessel_jax import checks, placements, simulate, validate
from tessel_jax.checks import InputError
from tessel_jax.graph import BlockGraph, PlacementError
from tessel_jax.schedule import Schedule, UnrolledSchedule
from tessel_jax.search import (CompletionError, InfeasibleScheduleError,
                               SearchTimeoutError, search_repetend)

class SearchArgs(NamedTuple):
  """Everything ``search_lib.run`` needs; see the flags for meanings."""

  placement: str | None = None
  placement_file: str | None = None
  devices: int = 4
  mode: str = "train"
  memory: int | None = None
  microbatches: int = 128
  f_span: int | None = None
  b_span: int | None = None
  allow_wrap: bool = True
  time_limit: float = 30.0
  seed: int = 0
  workers: int = 1
  output: str | None = None
  plot: str | None = None
  plot_steps: int = -1
  trace: str | None = None
  grid_steps: int = 64
  timing: bool = True


#: Exit code when no schedule fits under the memory limit.
EXIT_INFEASIBLE = 2
#: Exit code for a bad placement or a search that found nothing in time.
EXIT_ERROR = 1


def load_graph(placement: str | None = None, devices: int = 4,
               mode: str = "train", *, placement_file: str | None = None,
               f_span: int | None = None,
               b_span: int | None = None) -> BlockGraph:
  """The placement to search: a named one or one read from JSON.

  Args:
    placement: Name in ``tessel_jax.placements.PLACEMENTS``.
    devices: Devices on the pipeline axis (named placements only).
    mode: ``"train"`` or ``"infer"`` (named placements only).
    placement_file: Path of a DESIGN §4 placement JSON (instead of a name).
    f_span: Forward block span override (named placements only).
    b_span: Backward block span override (named placements only).

  Raises:
    PlacementError: if the name is unknown or the placement is malformed.
    OSError: if ``placement_file`` cannot be read.
  """
  if placement_file is not None:
    with open(placement_file, "rb") as f:
      data = f.read()
    try:
      return BlockGraph.from_json(data)
    except PlacementError as e:
      raise PlacementError(f"{placement_file}: {e}") from None
  if placement is None:
    raise PlacementError("give a placement name or a placement JSON file")
  spans = {k: v for k, v in (("f_span", f_span), ("b_span", b_span))
           if v is not None}
  return placements.get(placement, devices, mode=mode, **spans)


def repetend_window(schedule: Schedule,
                    num_microbatches: int) -> tuple[int, int] | None:
  """Steps ``[start, end)`` of the steady state in ``schedule.unroll(N)``.

  None when ``unroll`` does not use the warmup/cooldown templates for this
  ``N`` (too few micro-batches: the whole schedule is then re-solved) or
  returns the list schedule instead of the repetend.
  """
  rep = schedule.repetend
  if schedule.unroll(num_microbatches).period is None:
    return None  # the list schedule won: no repetend in the unrolling
  uses_templates = (num_microbatches >= schedule.min_template_microbatches
                    and (schedule.warmup or schedule.cooldown
                         or rep.max_offset == 0))
  if not uses_templates:
    return None
  end = (schedule.steady_start
         + (num_microbatches - rep.max_offset) * rep.period)
  return schedule.steady_start, end


def plot_steps(schedule: Schedule, window: tuple[int, int] | None,
               requested: int) -> int | None:
  """Steps to draw: ``requested`` if > 0, all if 0, else warmup + 4 periods."""
  if requested > 0:
    return requested
  if requested == 0 or window is None:
    return None
  return max(32, window[0] + 4 * schedule.period)


def measure(unrolled: UnrolledSchedule) -> dict[str, Any]:
  """Validates ``unrolled`` and returns its headline figures.

  Raises:
    validate.ScheduleValidationError: if the schedule breaks a rule.
  """
  validate.assert_valid(unrolled)
  stats = simulate.simulate(unrolled)
  lb = simulate.lower_bound_makespan(unrolled.graph, unrolled.num_microbatches)
  shared_lb = simulate.lower_bound_makespan_shared(unrolled.graph,
                                                   unrolled.num_microbatches)
  return {
      "makespan": stats.makespan,
      "makespan_lower_bound": lb,
      "makespan_ratio": round(stats.makespan / lb, 4),
      "makespan_lower_bound_shared": shared_lb,
      "makespan_ratio_shared": round(stats.makespan / shared_lb, 4),
      "peak_memory": list(stats.peak_memory),
      "max_peak_memory": max(stats.peak_memory),
      "bubble_ratio": round(stats.bubble_ratio, 4),
      "utilisation": [round(u, 4) for u in stats.utilisation],
  }


def search_and_measure(graph: BlockGraph, memory_limit: int | None,
                       num_microbatches: int, *, allow_wrap: bool = True,
                       time_limit_s: float = 30.0, seed: int = 0,
                       num_workers: int = 1, start: Any = None,
                       ) -> tuple[Schedule, UnrolledSchedule, dict[str, Any]]:
  """Searches ``graph``, unrolls ``num_microbatches``, validates, measures.

  ``start``: a known repetend to search from (``search_repetend``).

  Returns:
    ``(schedule, unrolled, figures)`` where ``figures`` holds the period,
    its lower bounds, the CP-SAT status and search seconds plus ``measure``.

  Raises:
    InfeasibleScheduleError: if nothing fits under ``memory_limit``.
    SearchTimeoutError: if CP-SAT found nothing in time.
    CompletionError: if warmup/cooldown could not be completed in time.
    validate.ScheduleValidationError: if the result breaks a rule (a bug).
  """
  schedule = search_repetend(graph, memory_limit, allow_wrap=allow_wrap,
                             time_limit_s=time_limit_s, seed=seed,
                             num_workers=num_workers, start=start)
  unrolled = schedule.unroll(num_microbatches)
  periodic = dataclasses.replace(schedule, alternative=None)
  figures = {
      "source": unrolled.source,
      "repetend_makespan": periodic.unroll(num_microbatches).makespan,
      "period": schedule.period,
      "period_lower_bound": schedule.period_lower_bound,
      "period_resource_bound": simulate.lower_bound_period(graph),
      "repetend_microbatches": schedule.repetend.microbatches,
      "status": schedule.status,
      "search_seconds": round(schedule.search_seconds, 3),
      "period_seconds": round(schedule.period_seconds, 3),
      "latency_status": schedule.latency_status,
  }
  figures.update(measure(unrolled))
  return schedule, unrolled, figures


def run(args: Any) -> dict[str, Any]:
  """Searches, checks, measures and saves one placement.

  Args:
    args: An ``SearchArgs`` (or anything with its
      fields).

  Returns:
    A dict: ``placement``, ``num_devices``, ``num_blocks``, ``mode``,
    ``memory_limit``, ``num_microbatches``, the figures of
    ``search_and_measure``, ``grid`` (text) and ``files`` (paths written).

  Raises:
    PlacementError: for an unknown or malformed placement.
    InfeasibleScheduleError: if nothing fits under ``args.memory``.
    SearchTimeoutError: if CP-SAT found nothing in time.
  """
  graph = load_graph(args.placement, args.devices, args.mode,
                     placement_file=args.placement_file, f_span=args.f_span,
                     b_span=args.b_span)
  n = checks.microbatches(args.microbatches, num_blocks=graph.num_blocks,
                          field="--microbatches", where=graph.name)
  schedule, unrolled, figures = search_and_measure(
      graph, args.memory, n, allow_wrap=args.allow_wrap,
      time_limit_s=args.time_limit, seed=args.seed,
      num_workers=args.workers)
  result: dict[str, Any] = {
      "placement": graph.name,
      "num_devices": graph.num_devices,
      "num_blocks": graph.num_blocks,
      "mode": "infer" if graph.is_inference else "train",
      "memory_limit": args.memory,
      "num_microbatches": n,
      **figures,
  }
  if not args.timing:
    result.pop("search_seconds")
    result.pop("period_seconds")
  result["grid"] = unrolled.grid(max_steps=args.grid_steps) if args.grid_steps else ""
  files = []
  if args.output:
    with open(args.output, "w") as f:
      f.write(unrolled.to_json(include_timing=args.timing))
      f.write("\n")
    files.append(args.output)
  if args.plot or args.trace:
    from tessel_jax import plot  # pylint: disable=import-outside-toplevel  (matplotlib: slow to import)
  if args.plot:
    window = repetend_window(schedule, n)
    plot.gantt(unrolled, args.plot,
               max_steps=plot_steps(schedule, window, args.plot_steps),
               repetend_period=schedule.period if window else None,
               repetend_start=window[0] if window else None,
               repetend_end=window[1] if window else None)
    files.append(args.plot)
  if args.trace:
    plot.chrome_trace(unrolled, args.trace)
    files.append(args.trace)
  result["files"] = files
  return result


def format_report(result: dict[str, Any]) -> str:
  """The text that ``python -m experiments.search`` prints."""
  limit = result["memory_limit"]
  lines = [
      f"placement    {result['placement']}  ({result['num_devices']} devices,"
      f" {result['num_blocks']} blocks, {result['mode']})",
      f"memory limit {'none' if limit is None else limit} per device",
  ]
  if result["grid"]:
    lines += ["", result["grid"], ""]
  bound = max(result["period_lower_bound"], result["period_resource_bound"])
  lines += [
      f"period       {result['period']}  (lower bound {bound}; CP-SAT"
      f" {result['status']}; {result['repetend_microbatches']} micro-batches"
      " in flight)",
      f"makespan     {result['makespan']} for N={result['num_microbatches']}"
      f"  (lower bound {result['makespan_lower_bound']}; ratio"
      f" {result['makespan_ratio']:.4f})",
      f"peak memory  {result['peak_memory']}",
      f"bubble ratio {100 * result['bubble_ratio']:.2f}%",
  ]
  if "search_seconds" in result:
    lines.append(f"search       {result['search_seconds']:.3f} s (period"
                 f" found{' and proven' if result['status'] == 'OPTIMAL' else ''}"
                 f" after {result['period_seconds']:.3f} s; latency"
                 f" {result['latency_status']})")
  for path in result["files"]:
    lines.append(f"wrote        {path}")
  return "\n".join(lines)


def main(args: Any, out: TextIO = sys.stdout,
         err: TextIO | None = None) -> int:
  """Runs ``run(args)``, prints the report; returns the process exit code.

  Returns:
    0 on success, ``EXIT_INFEASIBLE`` (2) when no schedule fits under the
    memory limit, ``EXIT_ERROR`` (1) for a bad input, an unreadable
    file or a search that found nothing in time. The reason is printed as
    one line on ``err`` (default stderr); for infeasible memory the
    smallest limit that works is also printed on ``out``
    (``min_memory_limit N``).
  """
  err = sys.stderr if err is None else err
  try:
    result = run(args)
  except InfeasibleScheduleError as e:
    print("infeasible: " + " ".join(str(e).split()), file=err)
    if e.min_memory_limit is not None:
      print(f"min_memory_limit {e.min_memory_limit}", file=out)
    return EXIT_INFEASIBLE
  except (InputError, SearchTimeoutError, CompletionError, OSError) as e:
    print("error: " + " ".join(str(e).split()), file=err)
    return EXIT_ERROR
  print(format_report(result), file=out)
  return 0

