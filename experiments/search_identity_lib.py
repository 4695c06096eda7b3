"""The work of ``experiments.search_identity`` (its flags are defined and
documented there; its ``main`` imports this module, so that
``--help`` imports no jax, CP-SAT or matplotlib). Reads the
flags it is given (``absl.flags.FLAGS``)."""

from __future__ import annotations

import hashlib
import json
import os
import time
from typing import Any

from absl import flags

from experiments import cli
from tessel_jax import placements
from tessel_jax.schedule import Repetend
from tessel_jax.search import (budget, cpsat, min_memory_limit,
                               search_repetend, smallest_memory_repetend)


def speed_up_wall_clocks(speed: float) -> None:
  """``time.perf_counter``, ``monotonic`` and ``time`` run ``speed`` times
  faster, as wall time does against a search's CPU time on a loaded
  machine (the search reads its safety nets in CPU seconds: unchanged)."""
  for name in ("perf_counter", "monotonic", "time"):
    real = getattr(time, name)
    setattr(time, name, lambda real=real: real() * speed)


def lift_caps() -> None:
  """No safety-net cut-offs (CPU seconds): the deterministic budgets decide
  alone."""
  cpsat._CPU_PER_DETERMINISTIC_S = 1e4  # pylint: disable=protected-access
  init = budget.Budget.__init__

  def no_cap(self, total, **kw):  # (it lost completion_s= before)
    init(self, total, **kw)
    self.cap_deadline += 1e6

  budget.Budget.__init__ = no_cap


def _fast(graph, time_limit: float) -> tuple[int, Repetend]:
  fastest = search_repetend(graph, None, complete=False,
                            list_alternative=False,
                            time_limit_s=time_limit).period
  limit, _, witness = smallest_memory_repetend(graph, fastest,
                                               time_limit_s=time_limit)
  return limit, witness


def make_cases(f: Any) -> list[dict[str, Any]]:
  """The case list (see the module doc)."""
  cases = []
  for name in dict.fromkeys(f.placements + f.start_placements):
    graph = placements.get(name, 4, mode="train")
    fast, witness = _fast(graph, f.time_limit)
    if name in f.placements:
      tight = min_memory_limit(graph, time_limit_s=f.time_limit)
      cases += [{"name": name, "devices": 4, "limit": limit}
                for limit in (tight, (tight + fast) // 2, fast, None)]
    if name in f.start_placements:
      cases.append({"name": name, "devices": 4, "limit": fast,
                    "start": [witness.period, list(witness.offsets),
                              list(witness.phases)]})
  for name in f.placements8:
    fast, _ = _fast(placements.get(name, 8, mode="train"), f.time_limit)
    cases.append({"name": name, "devices": 8, "limit": fast})
  return cases


def run_case(case: dict[str, Any], time_limit: float) -> dict[str, Any]:
  """One search, its figures and digest."""
  graph = placements.get(case["name"], case["devices"], mode="train")
  start = case.get("start") and Repetend(case["start"][0],
                                         tuple(case["start"][1]),
                                         tuple(case["start"][2]))
  cpu = time.process_time()
  sched = search_repetend(graph, case["limit"], time_limit_s=time_limit,
                          start=start)
  unrolled = sched.unroll(128)
  rep = sched.repetend
  text = json.dumps([rep.period, rep.offsets, rep.phases, str(sched.warmup),
                     str(sched.cooldown), sched.steady_start,
                     [(a.start, a.block, a.microbatch)
                      for a in unrolled.actions]], default=str)
  return dict(case, start=bool(start), period=sched.period,
              status=sched.status, makespan=unrolled.makespan,
              digest=hashlib.sha1(text.encode()).hexdigest()[:10],
              cut_by_clock=sched.cut_by_clock,
              cpu_s=round(time.process_time() - cpu, 2))


def main(argv: list[str]) -> None:
  cli.no_arguments(argv)
  f = flags.FLAGS
  cli.check_created(f.output, "--output", suffixes=(".json",))
  cli.check_created(f.cases, "--cases", suffixes=(".json",))
  for path in (f.output, f.cases):
    if os.path.dirname(path):
      os.makedirs(os.path.dirname(path), exist_ok=True)
  if f.lift_caps:
    lift_caps()
  if os.path.exists(f.cases):
    with open(f.cases) as inp:
      cases = json.load(inp)
  else:
    cases = make_cases(f)
    with open(f.cases, "w") as out:
      json.dump(cases, out)
  if f.clock_speed != 1.0:
    speed_up_wall_clocks(f.clock_speed)
  rows = []
  for case in cases:
    rows.append(run_case(case, f.time_limit))
    print(json.dumps(rows[-1]), flush=True)
  with open(f.output, "w") as out:
    json.dump({"load_average": os.getloadavg(), "lift_caps": f.lift_caps,
               "clock_speed": f.clock_speed, "cases": rows}, out,
              indent=1)
  if f.compare:
    with open(f.compare) as inp:
      old = json.load(inp)["cases"]
    same = sum(a["digest"] == b["digest"] for a, b in zip(old, rows))
    for a, b in zip(old, rows):
      if a["digest"] != b["digest"]:
        print(f"differs: {b['name']} d{b['devices']} limit {b['limit']}"
              f" start={b['start']}: {a['makespan']} -> {b['makespan']}")
    print(f"{same} of {len(rows)} identical")
