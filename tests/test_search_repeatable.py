"""The search gives the same schedule in two fresh processes.

A cold build searches its schedule in a new process each time; the result
must not depend on the process's hash seed nor on how fast wall time runs
while the search works (a loaded machine: ``search.clock``).
"""

from __future__ import annotations

import json
import subprocess
import sys


from tests.child_env import child_env

# The child: one search and its unrolling, printed as JSON. With an
# argument, every wall clock the search could read runs that many times
# faster than real time, as on a machine so loaded that the search gets a
# small share of a core.
_CHILD = r"""
import hashlib, json, sys, time
speed = float(sys.argv[1])
if speed != 1.0:
  for name in ("perf_counter", "monotonic", "time"):
    real = getattr(time, name)
    setattr(time, name, lambda real=real: real() * speed)
from tessel_jax import placements
from tessel_jax.search import search_repetend
graph = placements.get("nnshape", 4, mode="train")
s = search_repetend(graph, memory_limit=4, time_limit_s=2.0)
u = s.unroll(12)
print(json.dumps({
    "period": s.period, "status": s.status,
    "offsets": s.repetend.offsets, "phases": s.repetend.phases,
    "warmup": [[a.start, a.block, a.microbatch] for a in s.warmup],
    "cooldown": [[a.start, a.block, a.microbatch] for a in s.cooldown],
    "actions": hashlib.md5(repr(sorted(u.actions)).encode()).hexdigest(),
    "makespan": u.makespan, "cut_by_clock": s.cut_by_clock}))
"""


def _search_in_child(hash_seed: str, speed: float) -> dict:
  out = subprocess.run(
      [sys.executable, "-c", _CHILD, str(speed)], check=True,
      capture_output=True, text=True, timeout=300,
      env=child_env(PYTHONHASHSEED=hash_seed))
  return json.loads(out.stdout.strip().splitlines()[-1])


def test_two_cold_processes_search_the_same_schedule():
  """nnshape, 4 devices, limit 4 (its search takes tenths of a second of
  CPU): the same repetend, ramps and unrolling in two processes with other
  hash seeds, one of them seeing wall time run 200x faster. With the
  safety nets in wall seconds the fast clock cut that one's solves and
  changed its schedule."""
  plain = _search_in_child("1", 1.0)
  loaded = _search_in_child("2", 200.0)
  assert not plain["cut_by_clock"] and not loaded["cut_by_clock"]
  assert loaded == plain


def test_a_solve_stops_at_its_cpu_cap_and_is_counted():
  """``clock.CappedSolver`` stops a solve whose deterministic budget is far
  away once its thread's CPU seconds reach the cap, and ``clock.cuts``
  counts it (what ``Schedule.cut_by_clock`` reads)."""
  from ortools.sat.python import cp_model
  from tessel_jax.search import clock, cpsat
  model = cp_model.CpModel()
  starts = [model.NewIntVar(0, 10_000, f"s{i}") for i in range(60)]
  model.AddNoOverlap([model.NewFixedSizeIntervalVar(s, 1 + i % 9, f"i{i}")
                      for i, s in enumerate(starts)])
  model.Minimize(sum(i * s for i, s in enumerate(starts)))
  solver = cpsat.make_solver(100.0, 0, 1, cap_s=0.3)
  before, cpu0 = clock.cuts(), clock.now()
  solver.Solve(model)
  used = clock.now() - cpu0
  assert clock.cuts() == before + 1
  assert 0.3 <= used < 3.0
  assert solver.ResponseProto().deterministic_time < 100.0
