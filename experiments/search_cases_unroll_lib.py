"""The work of ``experiments.search_cases_unroll`` (its flags are defined and
documented there; its ``main`` imports this module, so that
``--help`` imports no jax, CP-SAT or matplotlib). Reads the
flags it is given (``absl.flags.FLAGS``)."""

from __future__ import annotations

import dataclasses
import functools
import json
import os
import random
import statistics
import time
from typing import Any

from absl import app, flags

from experiments import cli
from tessel_jax import placements
from tessel_jax.schedule import ScheduleError
from tessel_jax.search import (baselines, list_schedule, portfolio,
                               search_repetend, smallest_memory)


def _before(graph, n, limit, beat=None):
  """The alternative as it was: list schedule and every classic one."""
  del beat
  listed = list_schedule.best_list_schedule(graph, n, limit)
  best = None
  for name in baselines.for_placement(graph):
    try:
      sched = baselines.run(name, graph, n)
    except (ValueError, ScheduleError):
      continue
    if limit is not None and max(sched.peak_memory) > limit:
      continue
    if best is None or sched.makespan < best.makespan:
      best = sched
  if best is None:
    return listed
  if listed is None or best.makespan < portfolio.makespan(graph, listed):
    return tuple(sorted(best.actions))
  return listed


def _variant(schedule, name: str):
  graph, limit = schedule.graph, schedule.memory_limit
  if name == "before":
    alt = functools.partial(_before, graph, limit=limit)
  else:
    if name == "cold":
      portfolio.classic_figures.cache_clear()
      portfolio.cached_list_schedule.cache_clear()
    alt = functools.partial(portfolio.best_alternative, graph,
                            memory_limit=limit)
  return dataclasses.replace(schedule, alternative=alt)


def time_case(schedule, n: int, rounds: int, rng: random.Random
              ) -> dict[str, Any]:
  """Median wall and CPU seconds of ``unroll(n)`` per variant."""
  names = ["before", "cold", "warm"]
  wall: dict[str, list] = {k: [] for k in names}
  cpu: dict[str, list] = {k: [] for k in names}
  spans: dict[str, int] = {}
  _variant(schedule, "cold").unroll(n)  # fills the caches for "warm"
  for _ in range(rounds):
    order = names[:]
    rng.shuffle(order)
    for name in order:
      copy = _variant(schedule, name)
      w, c = time.perf_counter(), time.process_time()
      spans[name] = copy.unroll(n).makespan
      wall[name].append(time.perf_counter() - w)
      cpu[name].append(time.process_time() - c)
      if name == "cold":  # refill for a later "warm" in this round
        _variant(schedule, "warm").unroll(n)
  if len(set(spans.values())) != 1:
    raise AssertionError(f"variants disagree on the makespan: {spans}")
  return {"makespan": spans["cold"],
          **{f"{k}_wall_s": round(statistics.median(v), 3)
             for k, v in wall.items()},
          **{f"{k}_cpu_s": round(statistics.median(v), 3)
             for k, v in cpu.items()}}


def main(argv: list[str]) -> None:
  cli.no_arguments(argv)
  f = flags.FLAGS
  cli.check_created(f.output, "--output", suffixes=(".json",))
  if f.rounds < 1 or f.microbatches < 1 or f.devices < 1:
    raise app.UsageError("--rounds, --microbatches and --devices must be >= 1")
  names = f.placements or list(placements.PLACEMENTS)
  rng = random.Random(f.seed)
  rows = []
  for name in names:
    try:
      graph = placements.get(name, f.devices, mode="train")
    except (ValueError, NotImplementedError):
      continue
    limit = None
    if f.memories == "tight":
      limit, _ = smallest_memory(graph, None, time_limit_s=f.time_limit)
    schedule = search_repetend(graph, limit, time_limit_s=f.time_limit)
    row = {"placement": name, "devices": f.devices, "memory_limit": limit,
           **time_case(schedule, f.microbatches, f.rounds, rng)}
    rows.append(row)
    print(f"{name:>14} d{f.devices} limit {limit}: makespan"
          f" {row['makespan']}; unroll wall/CPU s: before"
          f" {row['before_wall_s']}/{row['before_cpu_s']}, cold"
          f" {row['cold_wall_s']}/{row['cold_cpu_s']}, warm"
          f" {row['warm_wall_s']}/{row['warm_cpu_s']}", flush=True)
  folder = os.path.dirname(f.output)
  if folder:
    os.makedirs(folder, exist_ok=True)
  with open(f.output, "w") as out:
    json.dump({"args": {k: getattr(f, k) for k in (
        "placements", "devices", "memories", "microbatches", "rounds",
        "time_limit", "seed")}, "load_average": os.getloadavg(),
        "cases": rows}, out, indent=1)
  print(f"wrote {f.output}")
