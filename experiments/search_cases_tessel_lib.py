"""One case of Tessel's evaluation searched by ours, and the results table
(``search_cases_tessel``, ``tessel_reference``). Nothing here reads flags."""

from __future__ import annotations

import time
from typing import Any

from experiments import tessel_cases
from tessel_jax import simulate, validate
from tessel_jax.search import InfeasibleScheduleError, search_repetend


def run_case(name: str, devices: int, train: bool, memory: int, n: int,
             time_limit: float, allow_wrap: bool) -> dict[str, Any]:
  """Searches one case; returns its figures."""
  graph = tessel_cases.get(name, devices, train)
  row: dict[str, Any] = {"placement": name, "devices": devices,
                         "mode": "train" if train else "infer",
                         "memory_limit": memory}
  w, c = time.perf_counter(), time.process_time()
  try:
    sched = search_repetend(graph, memory, time_limit_s=time_limit,
                            allow_wrap=allow_wrap)
  except InfeasibleScheduleError as e:
    row["error"] = str(e)
    return row
  unrolled = sched.unroll(n)
  row.update(wall_s=round(time.perf_counter() - w, 2),
             cpu_s=round(time.process_time() - c, 2))
  validate.assert_valid(unrolled, memory_limit=memory)
  bound = simulate.lower_bound_makespan_shared(graph, n)
  row.update(period=sched.period, status=sched.status,
             makespan=unrolled.makespan, source=unrolled.source,
             peak=max(unrolled.peak_memory), bound=bound,
             gap_pct=round(100 * (unrolled.makespan - bound) / bound, 3))
  return row


def markdown(rows: list[dict[str, Any]]) -> str:
  """The results as a markdown table."""
  lines = ["| script | placement | D | mode | limit | P, status | makespan |"
           " bound | gap | wall / CPU s |", "|---" * 10 + "|"]
  for r in rows:
    head = (f"| {r['script']} | {r['placement']} | {r['devices']} |"
            f" {r['mode']} | {r['memory_limit']} |")
    if "error" in r:
      lines.append(f"{head} {r['error'][:60]} | | | | |")
      continue
    lines.append(f"{head} {r['period']}, {r['status']} | {r['makespan']} |"
                 f" {r['bound']} | {r['gap_pct']}% |"
                 f" {r['wall_s']} / {r['cpu_s']} |")
  return "\n".join(lines) + "\n"
