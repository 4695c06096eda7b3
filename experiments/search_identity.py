"""Same schedules before and after a change of the search's code.

  python -m experiments.search_identity --cases=results/identity_cases.json \
      --output=results/identity_after.json [--compare=results/identity_before.json]

Runs ``search_repetend`` on a fixed list of cases with the CPU-seconds
safety nets lifted (``budget.Budget``'s cap and ``cpsat``'s per-solve net),
so the result depends only on the deterministic budgets, not on the load:
per case the period, status, N = 128 makespan and a digest of the
repetend, the ramp templates and every action of the unrolling. The case
list (``--cases``) is made once if it does not exist: at 4 devices each
of ``--placements`` at its tight, middle, fast and no limit, from the fast
limit's witness repetend for ``--start_placements``, and the fast limit at
8 devices for ``--placements8``; run the old code on the same list (e.g.
from ``git archive`` with ``PYTHONPATH``) and pass its output to
``--compare``.

The same schedules between processes and loads (issue 18): with
``--nolift_caps`` the nets stay (as in every build) and
``--clock_speed=200`` makes the wall clocks run 200 times faster; compare
its output with a plain ``--nolift_caps`` run's (``cut_by_clock`` in every
row says whether a net cut that search).
"""

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

flags.DEFINE_string("cases", "results/identity_cases.json",
                    "Case list (made if missing).")
flags.DEFINE_list("placements", ["vshape", "interleaved", "xshape", "mshape",
                                 "kshape", "nnshape_eager", "mllm", "zbv"],
                  "4-device placements (tight, middle, fast, no limit).")
flags.DEFINE_list("start_placements", ["xshape", "nnshape_eager", "zbv",
                                       "alphafold"],
                  "4-device placements also searched from the witness.")
flags.DEFINE_list("placements8", ["xshape", "mllm", "zbv"],
                  "8-device placements at their fast limit.")
flags.DEFINE_float("time_limit", 10.0, "Budget per search (seconds).")
flags.DEFINE_bool("lift_caps", True,
                  "Lift the CPU-seconds safety nets (search.clock): only the"
                  " deterministic budgets decide.")
flags.DEFINE_float("clock_speed", 1.0,
                   "The wall clocks the search could read run this many"
                   " times faster (a loaded machine, simulated): with"
                   " --nolift_caps the schedules must not change.")
flags.DEFINE_string("output", "results/identity.json", "Results JSON.")
flags.DEFINE_string("compare", None, "An earlier output to compare with.")


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


if __name__ == "__main__":
  cli.run(main)
