"""The work of ``experiments.tessel_reference`` (its flags are defined and
documented there; its ``main`` imports this module, so that
``--help`` imports no jax, CP-SAT or matplotlib). Reads the
flags it is given (``absl.flags.FLAGS``)."""

from __future__ import annotations

import contextlib
import io
import json
import os
import resource
import subprocess
import sys
import time
from typing import Any

from absl import app, flags

from experiments import cli, tessel_cases
from experiments.search_cases_tessel_lib import run_case as search_ours
from tessel_jax import validate
from tessel_jax.schedule import Action, UnrolledSchedule


def tessel_search(repo: str, name: str, memory: int, nmicros: int,
                  n: int) -> dict[str, Any]:
  """One ``Composer.compose_n`` of Tessel (in this process), unrolled."""
  sys.path[:0] = [repo, os.path.join(repo, "examples", "simulator")]
  # pylint: disable=import-outside-toplevel,import-error
  from cases_tessel import Placement
  from tessel.schedule.composer import Composer
  micro = getattr(Placement, name)(4, train=True)
  w, c = time.perf_counter(), time.process_time()
  with contextlib.redirect_stdout(io.StringIO()):
    sched = Composer.compose_n(micro, memory, nmicros)
  row: dict[str, Any] = {"wall_s": round(time.perf_counter() - w, 1),
                         "cpu_s": round(time.process_time() - c, 1)}
  if sched is None:
    return dict(row, result="no schedule")
  start, end = sched.repetend
  unrolled = sched.unroll(n)
  return dict(row, warmup=start, period=end - start,
              cooldown=sched.nsteps - end, makespan=unrolled.nsteps,
              peak=max(unrolled.peak_memory(d) for d in range(4)),
              valid=bool(unrolled.validate()),
              actions=sorted([unrolled.step(b), b.gid, b.mid]
                             for b in unrolled.all_blocks()))


def our_check(name: str, memory: int, n: int,
              actions: list[list[int]]) -> dict[str, Any]:
  """Tessel's unrolled schedule (``[step, block, micro-batch]`` each, its
  blocks numbered in chain order as ``tessel_cases`` numbers them) read by
  this project's validator under the same limit, and its makespan and
  peak by this project's ``simulate``."""
  graph = tessel_cases.get(name, 4, train=True)
  sched = UnrolledSchedule(
      graph=graph, num_microbatches=n, memory_limit=memory,
      actions=tuple(sorted(Action(s, b, m) for s, b, m in actions)),
      source="tessel-z3")
  problems = validate.check(sched)
  return {"our_valid": not problems,
          "our_problem": problems[0].message if problems else None,
          "our_makespan": sched.makespan, "our_peak": max(sched.peak_memory)}


def run_tessel(repo: str, name: str, memory: int, nmicros: int, n: int,
               cpu_limit: int) -> dict[str, Any]:
  """``tessel_search`` in a child process capped at ``cpu_limit`` CPU s."""
  def cap() -> None:
    resource.setrlimit(resource.RLIMIT_CPU, (cpu_limit, cpu_limit))

  proc = subprocess.run(
      [sys.executable, "-m", "experiments.tessel_reference",
       f"--tessel_repo={repo}", f"--worker={name}:{memory}:{nmicros}:{n}"],
      capture_output=True, text=True, preexec_fn=cap, check=False)
  row = {"nmicros": nmicros}
  lines = proc.stdout.strip().splitlines()
  if proc.returncode != 0 or not lines:
    return dict(row, result=f"none within {cpu_limit} CPU s"
                f" (exit {proc.returncode})")
  row.update(json.loads(lines[-1]))
  if "actions" in row:
    row.update(our_check(name, memory, n, row.pop("actions")))
  return row


def run_case(repo: str, name: str, memory: int, nmicros: list[int], n: int,
             cpu_limit: int, time_limit: float) -> dict[str, Any]:
  """Tessel at each ``nmicros`` and our search, for one case."""
  tessel = [run_tessel(repo, name, memory, k, n, cpu_limit)
            for k in nmicros]
  ours = search_ours(name, 4, True, memory, n, time_limit, allow_wrap=True)
  spans = [t["makespan"] for t in tessel if "makespan" in t]
  return {"placement": name, "devices": 4, "memory_limit": memory,
          "microbatches": n, "tessel": tessel,
          "tessel_best": min(spans) if spans else None,
          "ours": {k: ours.get(k) for k in ("period", "status", "makespan",
                                            "source", "peak", "bound",
                                            "cpu_s")}}


def main(argv: list[str]) -> None:
  cli.no_arguments(argv)
  f = flags.FLAGS
  if not f.tessel_repo or not os.path.isdir(f.tessel_repo):
    raise app.UsageError("--tessel_repo must name a checkout of"
                         " github.com/zhiqi-0/Tessel")
  if f.worker:
    name, memory, nmicros, n = f.worker.split(":")
    print(json.dumps(tessel_search(f.tessel_repo, name, int(memory),
                                   int(nmicros), int(n))))
    return
  cli.check_created(f.output, "--output", suffixes=(".json",))
  rows = []
  for case in f.cases:
    name, memory = case.split(":")
    rows.append(run_case(f.tessel_repo, name, int(memory),
                         [int(k) for k in f.nmicros], f.microbatches,
                         f.cpu_limit, f.time_limit))
    print(json.dumps(rows[-1]), flush=True)
  if os.path.dirname(f.output):
    os.makedirs(os.path.dirname(f.output), exist_ok=True)
  with open(f.output, "w") as out:
    json.dump({"args": {k: getattr(f, k) for k in (
        "cases", "nmicros", "microbatches", "cpu_limit", "time_limit")},
               "load_average": os.getloadavg(), "cases": rows}, out,
              indent=1)
  print(f"wrote {f.output}")
