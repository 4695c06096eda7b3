"""The schedule benchmark: every placement x devices x memory x mode.

For each named placement, device count (where the placement accepts it) and
mode, the searched schedule is compared with every baseline that fits the
placement (``baselines.for_placement``). Training graphs run two memory
cases: ``tight`` (the smallest per-device limit that admits any schedule,
``min_memory_limit``) and ``loose`` (no limit); inference graphs hold no
memory and run one case (``none``). Every schedule is validated.

``run(args)`` returns (and writes) the results; ``markdown(results)`` is the
table. A case that fails records its error and the run goes on. Nothing here
reads flags.
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import time
from collections.abc import Callable
from typing import Any, NamedTuple

from experiments import progress, search_lib
from experiments.runs import write_text
from tessel_jax import placements
from tessel_jax.graph import BlockGraph
from tessel_jax.search import (baselines, search_repetend,
                               smallest_memory_repetend)

class CasesArgs(NamedTuple):
  """Everything ``search_cases_lib.run`` needs; see the flags for meanings."""

  placements: tuple[str, ...] | None = None
  devices: tuple[int, ...] = (4, 8, 16, 32)
  modes: tuple[str, ...] = ("train", "infer")
  memories: tuple[str, ...] = ("tight", "fast", "loose")
  microbatches: int = 128
  time_limit: float = 60.0
  seed: int = 0
  workers: int = 1
  allow_wrap: bool = True
  fast_hint: bool = True
  output: str | None = None
  markdown: str | None = None


RESULTS_DIR = "results"

#: Key of a memory case's witness repetend (the ``fast`` case: a repetend
#: at the fastest period under that limit, from the memory search).
START = "_start"


def args_hash(args: Any) -> str:
  """Short hash of the arguments that change results (not output paths)."""
  fields = {k: v for k, v in args._asdict().items()
            if k not in ("output", "markdown")}
  text = json.dumps(fields, sort_keys=True, default=list)
  return hashlib.sha256(text.encode()).hexdigest()[:12]


def default_output(args: Any) -> str:
  return os.path.join(RESULTS_DIR, f"search_cases_{args_hash(args)}.json")


def _error(e: BaseException) -> str:
  return f"{type(e).__name__}: {e}"


def placement_names(args: Any) -> list[str]:
  """The placements to run, checked against ``placements.PLACEMENTS``.

  Raises:
    ValueError: naming the unknown placements and the known ones.
  """
  known = list(placements.PLACEMENTS)
  if args.placements is None:
    return known
  unknown = [p for p in args.placements if p not in placements.PLACEMENTS]
  if unknown:
    raise ValueError(f"unknown placements {unknown}; known: {known}")
  return list(args.placements)


def memory_cases(graph: BlockGraph, wanted: tuple[str, ...], *,
                 allow_wrap: bool, time_limit_s: float, seed: int,
                 workers: int) -> list[dict[str, Any]]:
  """The memory cases of ``graph`` as dicts.

  Each has ``memory_case`` and ``memory_limit``: ``tight`` is the smallest
  limit that admits any schedule, ``fast`` the smallest limit at which the
  fastest (unlimited) period is still reached, ``loose`` no limit. ``tight``
  and ``fast`` also have ``memory_search_seconds`` (time to find the limit),
  ``memory_limit_proven: False`` where CP-SAT found a limit but did not prove
  it minimal in time (the best found is used), and ``error`` where it found
  none. ``middle`` is halfway between ``tight`` and ``fast`` (rounded
  down; the ramps matter most there, see ``search.ramps``). A graph that
  holds no memory has the one case ``none`` (no limit).
  """
  if all(b.memory <= 0 for b in graph.blocks):
    return [{"memory_case": "none", "memory_limit": None}]
  kw = dict(allow_wrap=allow_wrap, time_limit_s=time_limit_s, seed=seed,
            num_workers=workers)
  rows = {case: _limit_case(graph, case, kw) for case in ("tight", "fast")
          if case in wanted or "middle" in wanted}
  if "middle" in wanted:
    rows["middle"] = _middle_case(rows["tight"], rows["fast"])
  if "loose" in wanted:
    rows["loose"] = {"memory_case": "loose", "memory_limit": None}
  return [rows[case] for case in ("tight", "middle", "fast", "loose")
          if case in wanted]


def _limit_case(graph: BlockGraph, case: str,
                kw: dict[str, Any]) -> dict[str, Any]:
  """The ``tight`` or ``fast`` case (see ``memory_cases``)."""
  row: dict[str, Any] = {"memory_case": case, "memory_limit": None}
  t0 = time.perf_counter()
  try:
    period = None
    if case == "fast":
      period = search_repetend(graph, None, complete=False, **kw).period
    limit, proven, witness = smallest_memory_repetend(graph, period, **kw)
    if case == "fast" and witness is not None:
      row[START] = witness  # not written: run() pops it
    if not proven:
      row["memory_limit_proven"] = False
    if limit is None:
      row["error"] = (f"{case} memory limit: CP-SAT found none within"
                      f" {kw['time_limit_s']:g} s; raise --time_limit")
    row["memory_limit"] = limit
  except Exception as e:  # pylint: disable=broad-except
    row["error"] = _error(e)
  row["memory_search_seconds"] = round(time.perf_counter() - t0, 3)
  return row


def _middle_case(tight: dict[str, Any],
                 fast: dict[str, Any]) -> dict[str, Any]:
  """Halfway between the ``tight`` and ``fast`` limits."""
  row: dict[str, Any] = {"memory_case": "middle", "memory_limit": None}
  for other in (tight, fast):
    if "error" in other or other["memory_limit"] is None:
      row["error"] = f"middle memory limit: {other['memory_case']} has none"
      return row
  row["memory_limit"] = (tight["memory_limit"] + fast["memory_limit"]) // 2
  if not (tight.get("memory_limit_proven", True)
          and fast.get("memory_limit_proven", True)):
    row["memory_limit_proven"] = False
  return row


def run_baselines(graph: BlockGraph,
                  num_microbatches: int) -> dict[str, dict[str, Any]]:
  """Every fitting baseline of ``graph``: validated figures or its error."""
  try:
    names = baselines.for_placement(graph)
  except Exception as e:  # pylint: disable=broad-except
    return {"*": {"error": _error(e)}}
  out: dict[str, dict[str, Any]] = {}
  for name in names:
    try:
      schedule = baselines.BASELINES[name](graph, num_microbatches)
      out[name] = search_lib.measure(schedule)
    except Exception as e:  # pylint: disable=broad-except
      out[name] = {"error": _error(e)}
  return out


def compare(case: dict[str, Any],
            baselines: dict[str, dict[str, Any]]) -> dict[str, Any]:
  """Baseline figures for one memory case, with memory fit and speedup."""
  limit = case["memory_limit"]
  rows: dict[str, Any] = {}
  best = None
  for name, figures in baselines.items():
    if "error" in figures:
      rows[name] = dict(figures)
      continue
    fits = limit is None or figures["max_peak_memory"] <= limit
    rows[name] = {
        "makespan": figures["makespan"],
        "max_peak_memory": figures["max_peak_memory"],
        "bubble_ratio": figures["bubble_ratio"],
        "fits_memory": fits,
    }
    if fits and (best is None or figures["makespan"] < best[1]):
      best = (name, figures["makespan"])
  out: dict[str, Any] = {"baselines": rows}
  if best is not None and case.get("makespan"):
    out["best_baseline"] = best[0]
    out["speedup_vs_best_baseline"] = round(best[1] / case["makespan"], 4)
  return out


def run_case(graph: BlockGraph, limit: int | None, args: Any,
             start: Any = None) -> dict[str, Any]:
  """Searches one case (from the repetend ``start`` if given); returns its
  figures (validated)."""
  _, _, figures = search_lib.search_and_measure(
      graph, limit, args.microbatches, allow_wrap=args.allow_wrap,
      time_limit_s=args.time_limit, seed=args.seed, num_workers=args.workers,
      start=start)
  if start is not None:
    figures["started_from_memory_search"] = True
  return figures


def run(args: Any, log: Callable[[str], None] = print) -> dict[str, Any]:
  """Runs the benchmark; writes the results JSON (after every case).

  Args:
    args: An ``CasesArgs``.
    log: Receives one progress line per case.

  Returns:
    ``{"args", "environment", "cases", "skipped", "output"}``: ``cases``
    has one dict per (placement, devices, mode, memory case) with the
    searched figures (or ``error``) and the baselines; ``skipped`` lists the
    (placement, devices, mode) a placement does not accept.
  """
  output = args.output or default_output(args)
  results: dict[str, Any] = {
      "args": args._asdict(),
      "environment": {"python": platform.python_version(),
                      "machine": platform.machine()},
      "cases": [], "skipped": [], "output": output,
  }
  t0 = time.perf_counter()
  eta = progress.Eta(len(placement_names(args)) * len(args.devices)
                     * len(args.modes))
  for name in placement_names(args):
    for devices in args.devices:
      for mode in args.modes:
        log(eta.line(f"{name} d{devices} {mode}: baselines, memory cases,"
                     " searches"))
        try:
          graph = placements.get(name, devices, mode=mode)
        except (ValueError, NotImplementedError) as e:
          results["skipped"].append({"placement": name, "devices": devices,
                                     "mode": mode, "reason": str(e)})
          continue
        base = run_baselines(graph, args.microbatches)
        for memory in memory_cases(
            graph, args.memories, allow_wrap=args.allow_wrap,
            time_limit_s=args.time_limit, seed=args.seed,
            workers=args.workers):
          start = memory.pop(START, None)
          if not getattr(args, "fast_hint", True):
            start = None
          case: dict[str, Any] = {
              "placement": name, "graph": graph.name, "devices": devices,
              "mode": mode, "num_blocks": graph.num_blocks,
              "num_microbatches": args.microbatches, **memory,
          }
          if "error" not in case:
            try:
              case.update(run_case(graph, case["memory_limit"], args, start))
            except Exception as e:  # pylint: disable=broad-except
              case["error"] = _error(e)
          case.update(compare(case, base))
          results["cases"].append(case)
          log(_progress(case, time.perf_counter() - t0))
          _write(results, output)
  _write(results, output)
  return results


def _write(results: dict[str, Any], path: str) -> None:
  write_text(path, json.dumps(results, indent=1) + "\n")


def _progress(case: dict[str, Any], elapsed: float) -> str:
  head = (f"[{elapsed:7.1f}s] {case['placement']:>14} d{case['devices']:<2}"
          f" {case['mode']:<5} {case['memory_case']:<5}")
  if "error" in case:
    return f"{head} ERROR {case['error']}"
  return (f"{head} P={case['period']} ({case['status']})"
          f" makespan={case['makespan']} ratio={case['makespan_ratio']:.3f}"
          f" peak={case['max_peak_memory']}"
          f" period {case['period_seconds']:.2f}s total {case['search_seconds']:.2f}s")


def _baseline_cell(baselines: dict[str, Any]) -> str:
  parts = []
  for name, row in baselines.items():
    if "error" in row:
      parts.append(f"{name}: error")
    else:
      mark = "" if row["fits_memory"] else "*"
      parts.append(f"{name} {row['makespan']}/{row['max_peak_memory']}{mark}")
  return ", ".join(parts) or "-"


def _bound_cell(case: dict[str, Any]) -> str:
  """LB, and the shared-block bound where it is tighter."""
  lb, shared = case["makespan_lower_bound"], case.get(
      "makespan_lower_bound_shared")
  if shared is None or shared == lb:
    return str(lb)
  return f"{lb} ({shared}: {case['makespan'] / shared:.3f})"


def markdown(results: dict[str, Any]) -> str:
  """The results as a markdown table (one row per case)."""
  lines = [
      "| placement | D | mode | memory | period (LB) | status | period s / total s |"
      " makespan | LB | ratio | peak | bubble | baselines makespan/peak |"
      " speedup |",
      "|---|---:|---|---|---|---|---:|---:|---:|---:|---:|---:|---|---|",
  ]
  for c in results["cases"]:
    memory = c["memory_case"]
    if c["memory_limit"] is not None:
      memory += f" {c['memory_limit']}"
      if c.get("memory_limit_proven") is False:
        memory += " (best found)"
    speedup = (f"{c['speedup_vs_best_baseline']:.3f}x ({c['best_baseline']})"
               if "best_baseline" in c else "-")
    if "error" in c:
      cells = ["-", f"error: {c['error']}".replace("|", "/"), "-", "-", "-",
               "-", "-", "-"]
    else:
      bound = max(c["period_lower_bound"], c["period_resource_bound"])
      status = c["status"] + (" (start)" if c.get(
          "started_from_memory_search") else "")
      cells = [f"{c['period']} ({bound})", status,
               f"{c['period_seconds']:.2f} / {c['search_seconds']:.2f}",
               str(c["makespan"]) + (
                   f" (list; repetend {c['repetend_makespan']})"
                   if c.get("source", "").endswith("-list") else ""),
               _bound_cell(c), f"{c['makespan_ratio']:.3f}",
               str(c["max_peak_memory"]), f"{100 * c['bubble_ratio']:.1f}%"]
    lines.append("| " + " | ".join(
        [c["placement"], str(c["devices"]), c["mode"], memory] + cells
        + [_baseline_cell(c["baselines"]), speedup]) + " |")
  lines.append("")
  lines.append(f"N = {results['args']['microbatches']} micro-batches;"
               " LB = makespan lower bound; peak = largest per-device memory;"
               " `*` = baseline over the case's memory limit; speedup ="
               " best fitting baseline makespan / searched makespan;"
               " `(list; repetend M)` = the list schedule of all N"
               " micro-batches was shorter than the repetend's unrolling"
               " (makespan M); `LB (S: r)` = the bound tightened for blocks on"
               " every device (simulate.shared_device_bounds) and the ratio"
               " to it; `(best found)` = a memory limit CP-SAT did"
               " not prove minimal in time; `(start)` = searched from the"
               " repetend the memory search found at that limit.")
  if results["skipped"]:
    skipped = ", ".join(f"{s['placement']} d{s['devices']} {s['mode']}"
                        for s in results["skipped"])
    lines.append(f"Not accepted by the placement (skipped): {skipped}.")
  return "\n".join(lines)
