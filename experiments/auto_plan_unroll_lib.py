"""The work of ``experiments.auto_plan_unroll`` (its flags are defined and
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

from absl import flags

from tessel_jax import placements, simulate
from tessel_jax.graph import BlockGraph
from tessel_jax.hand_placement import SPANS
from tessel_jax.schedule import SPLIT_MICROBATCHES, Schedule, concatenate
from tessel_jax.search import (InfeasibleScheduleError, search_repetend,
                               smallest_memory)


def _cases(f: Any) -> list[dict[str, Any]]:
  """``{name, graph, limit, time_limit_s, microbatches}`` per case."""
  if f.searches:
    with open(f.searches, encoding="utf-8") as fh:
      raw = json.load(fh)
    return [{"name": f"{i}:{r['graph']['name']}@{r['limit']}",
             "graph": BlockGraph.from_dict(r["graph"]), "limit": r["limit"],
             "time_limit_s": r["time_limit_s"],
             "microbatches": r.get("microbatches", 8)}
            for i, r in enumerate(raw)]
  out = []
  for name in f.placements:
    for pipe in (int(p) for p in f.pipes):
      graph = placements.get(name, pipe)
      graph = dataclasses.replace(graph, blocks=tuple(
          dataclasses.replace(b, span=SPANS[b.kind]) for b in graph.blocks))
      n = 2 * pipe  # README GPT: N = 8 over pipe x (4 / pipe) replicas
      tight = smallest_memory(graph, time_limit_s=f.time_limit)[0]
      loose = max(search_repetend(graph, time_limit_s=f.time_limit).unroll(
          n).peak_memory)
      for limit in sorted({None, tight, (tight + loose) // 2},
                          key=lambda x: -1 if x is None else x):
        out.append({"name": f"{name} pipe{pipe}@{limit}", "graph": graph,
                    "limit": limit, "time_limit_s": f.time_limit,
                    "microbatches": n})
  return out


def _before(sched: Schedule, n: int, memo: dict[int, Any]) -> Any:
  """``unroll(n)`` as it was: every split, every small N by CP-SAT."""
  if n in memo:
    return memo[n]
  best = Schedule._unroll_once(sched, n)  # pylint: disable=protected-access
  if n <= SPLIT_MICROBATCHES:
    best = min([best] + [concatenate(_before(sched, a, memo),
                                     _before(sched, n - a, memo))
                         for a in range(1, n // 2 + 1)],
               key=lambda u: u.makespan)
  memo[n] = best
  return best


def _fresh(sched: Schedule, old: bool) -> Schedule:
  """A copy with every memo empty (``old``: its completer without the
  lower bound)."""
  out = {}
  for name in ("completer", "alternative"):
    fn = getattr(sched, name)
    if fn is None:
      continue
    inner = fn.__wrapped__  # a functools.partial under an lru_cache
    if name == "completer" and old:
      inner = functools.partial(inner, use_bound=False)
    out[name] = functools.lru_cache(maxsize=16)(inner)
  return dataclasses.replace(sched, **out)


def main(argv: list[str]) -> None:
  del argv
  f = flags.FLAGS
  cases = _cases(f)
  for case in cases:
    try:
      case["schedule"] = search_repetend(case["graph"], case["limit"],
                                         time_limit_s=case["time_limit_s"])
    except InfeasibleScheduleError:
      case["schedule"] = None
  cases = [c for c in cases if c["schedule"] is not None]
  rng = random.Random(f.seed)
  timing: dict[str, list[tuple[float, float]]] = {"before": [], "now": []}
  spans: dict[str, dict[str, int]] = {c["name"]: {} for c in cases}
  for _ in range(f.rounds):
    totals = {"before": [0.0, 0.0], "now": [0.0, 0.0]}
    jobs = [(c, v) for c in cases for v in ("before", "now")]
    rng.shuffle(jobs)
    for case, variant in jobs:
      sched = _fresh(case["schedule"], old=variant == "before")
      n = case["microbatches"]
      t0, c0 = time.perf_counter(), time.process_time()
      if variant == "before":
        got = _before(sched, n, {})
      else:
        got = sched.unroll(n)
      totals[variant][0] += time.perf_counter() - t0
      totals[variant][1] += time.process_time() - c0
      spans[case["name"]][variant] = got.makespan
      spans[case["name"]]["lower_bound"] = simulate.lower_bound_makespan_shared(
          case["graph"], n)
    for v in totals:
      timing[v].append(tuple(totals[v]))
  result = {"cases": spans, "load_average": [round(x, 2) for x in
                                             os.getloadavg()]}
  for v, runs in timing.items():
    result[v] = {"wall_s": round(statistics.median(r[0] for r in runs), 3),
                 "cpu_s": round(statistics.median(r[1] for r in runs), 3)}
    print(f"{v:>7}: wall {result[v]['wall_s']:.2f} s, CPU"
          f" {result[v]['cpu_s']:.2f} s over {len(cases)} unrolls")
  worse = {k: v for k, v in spans.items() if v["now"] > v["before"]}
  print(f"makespan now > before in {len(worse)} of {len(spans)}: {worse}")
  for k, v in spans.items():
    print(f"  {k:<28} before {v['before']:5d} now {v['now']:5d}"
          f" bound {v['lower_bound']:5d}")
  os.makedirs(os.path.dirname(f.output) or ".", exist_ok=True)
  with open(f.output, "w", encoding="utf-8") as fh:
    json.dump(result, fh, indent=1)
