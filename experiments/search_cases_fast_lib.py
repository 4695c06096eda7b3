"""The work of ``experiments.search_cases_fast`` (its flags are defined and
documented there; its ``main`` imports this module, so that
``--help`` imports no jax, CP-SAT or matplotlib). Reads the
flags it is given (``absl.flags.FLAGS``)."""

from __future__ import annotations

import contextlib
import json
import os
import random
import time
from typing import Any

from absl import app, flags

from experiments import cli, search_profile_lib
from tessel_jax import placements, validate
from tessel_jax.schedule import Repetend
from tessel_jax.search import (period_search, search_repetend,
                               smallest_memory_repetend)


def _timed(fn) -> tuple[Any, float, float]:
  w, c = time.perf_counter(), time.process_time()
  out = fn()
  return out, time.perf_counter() - w, time.process_time() - c


def fast_case(name: str, devices: int, time_limit: float,
              cache: dict[str, Any]) -> dict[str, Any]:
  """The fastest period, the fast limit and its witness repetend of one
  placement (training), from ``cache`` (``"<name> d<devices>"``) when
  there, else from the memory search (timed) and added to ``cache``."""
  key = f"{name} d{devices}"
  if key not in cache:
    graph = placements.get(name, devices, mode="train")
    fastest = search_repetend(graph, None, complete=False,
                              list_alternative=False,
                              time_limit_s=time_limit).period
    (limit, proven, witness), wall, cpu = _timed(
        lambda: smallest_memory_repetend(graph, fastest,
                                         time_limit_s=time_limit))
    cache[key] = {"period": fastest, "limit": limit, "proven": proven,
                  "offsets": witness and list(witness.offsets),
                  "phases": witness and list(witness.phases),
                  "wall": round(wall, 2), "cpu": round(cpu, 2)}
  return cache[key]


def run_case(name: str, devices: int, n: int, rounds: int, time_limit: float,
             rng: random.Random, cache: dict[str, Any],
             profile: bool = False, compare: bool = False
             ) -> dict[str, Any]:
  """One placement: the memory search (or its cached result), then both
  searches per round (with ``profile``, each with its
  ``search_profile_lib`` record; with ``compare``, the search from scratch
  without and with the constructive scheduler, both ways, too)."""
  graph = placements.get(name, devices, mode="train")
  fast = fast_case(name, devices, time_limit, cache)
  limit = fast["limit"]
  witness = (limit and fast["offsets"] is not None
             and Repetend(fast["period"], tuple(fast["offsets"]),
                          tuple(fast["phases"])))
  row: dict[str, Any] = {
      "placement": name, "devices": devices, "fastest_period": fast["period"],
      "memory_limit": limit, "memory_limit_proven": fast["proven"],
      "memory_search_wall_s": fast["wall"],
      "memory_search_cpu_s": fast["cpu"]}
  if limit is None:
    return row
  for _ in range(rounds):
    order = ["scratch", "start"] if witness else ["scratch"]
    order += (["scratch_noconstruct", "scratch_first", "scratch_after"]
              if compare else [])
    rng.shuffle(order)
    for variant in order:
      start = witness if variant == "start" else None
      with (search_profile_lib.profiled() if profile
            else contextlib.nullcontext()) as prof, _construct(variant):
        sched, wall, cpu = _timed(lambda: search_repetend(  # noqa: B023
            graph, limit, time_limit_s=time_limit, start=start))
      unrolled = sched.unroll(n)
      validate.assert_valid(unrolled)
      row.setdefault(variant, []).append({
          "period": sched.period, "status": sched.status,
          "period_lower_bound": sched.period_lower_bound,
          "makespan": unrolled.makespan, "wall_s": round(wall, 2),
          "cpu_s": round(cpu, 2)})
      if prof is not None:
        row[variant][-1].update(prof.summary(), solves=prof.solves)
  return row


_VARIANTS = ("scratch", "start", "scratch_noconstruct", "scratch_first",
             "scratch_after")


@contextlib.contextmanager
def _construct(variant: str):
  """The period search as ``variant`` runs it inside the block: its
  constructive scheduler before the first solve (``scratch_first``), once
  that solve decided nothing (``scratch_after``), off
  (``scratch_noconstruct``), or as configured (the others)."""
  before = period_search.CONSTRUCT_TRIES, period_search.CONSTRUCT_FIRST
  if variant == "scratch_noconstruct":
    period_search.CONSTRUCT_TRIES = 0
  elif variant in ("scratch_first", "scratch_after"):
    period_search.CONSTRUCT_TRIES = 64
    period_search.CONSTRUCT_FIRST = variant == "scratch_first"
  try:
    yield
  finally:
    period_search.CONSTRUCT_TRIES, period_search.CONSTRUCT_FIRST = before


def _given_limits(specs: list[str]) -> dict[str, Any]:
  """``--limits`` as cache entries without a witness (``fast_case``)."""
  out = {}
  for spec in specs:
    try:
      name, devices, limit = spec.split(":")
      out[f"{name} d{int(devices)}"] = {
          "period": None, "limit": int(limit), "proven": None,
          "offsets": None, "phases": None, "wall": None, "cpu": None}
    except ValueError:
      raise app.UsageError(f"--limits takes placement:devices:limit, got"
                           f" {spec!r}") from None
  return out


def main(argv: list[str]) -> None:
  cli.no_arguments(argv)
  f = flags.FLAGS
  cli.check_created(f.output, "--output", suffixes=(".json",))
  try:
    devices = [int(d) for d in f.devices]
  except ValueError:
    raise app.UsageError(f"--devices must be integers, got {f.devices}"
                         ) from None
  rng = random.Random(f.seed)
  cache: dict[str, Any] = {}
  if f.witnesses and os.path.exists(f.witnesses):
    with open(f.witnesses) as inp:
      cache = json.load(inp)
  cache.update(_given_limits(f.limits))
  rows = []
  for name in f.placements:
    for d in devices:
      fast_case(name, d, f.time_limit, cache)
      if f.witnesses:  # before the searches, which may fail
        with open(f.witnesses, "w") as out:  # not the --limits entries
          json.dump({k: v for k, v in cache.items()
                     if v["period"] is not None}, out)
      row = run_case(name, d, f.microbatches, f.rounds, f.time_limit, rng,
                     cache, f.profile, f.compare_construct)
      rows.append(row)
      print(json.dumps({k: v if k not in _VARIANTS else [
          {a: b for a, b in r.items() if a != "solves"} for r in v]
                        for k, v in row.items()}), flush=True)
  folder = os.path.dirname(f.output)
  if folder:
    os.makedirs(folder, exist_ok=True)
  with open(f.output, "w") as out:
    args = {k: getattr(f, k) for k in (
        "placements", "devices", "microbatches", "rounds", "time_limit",
        "seed", "witnesses", "profile", "compare_construct")}
    json.dump({"args": args, "load_average": os.getloadavg(),
               "cases": rows}, out, indent=1)
  print(f"wrote {f.output}")
