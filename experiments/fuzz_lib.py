"""Fuzz the search: random placements, limits and N; every schedule checked.

Each case draws a random placement (2-16 blocks, 2-16 devices, blocks on
several devices, edge delays, training or inference), a memory limit from
infeasible to loose and a few N, then:

* searches it (``search_repetend``); a claimed infeasibility is re-checked
  by searching again at the claimed smallest limit, which must succeed;
* unrolls every N and checks each schedule twice: with the library's
  validator and with :func:`independent_check`, written from DESIGN.md §3
  alone (it shares no code with ``validate`` or the search);
* checks small-N completion: ``unroll(N)`` is never longer than
  ``unroll(a)`` followed by ``unroll(N - a)``;
* counts raw errors (any exception but the library's own infeasibility,
  search-timeout and completion errors), search timeouts (CP-SAT found
  nothing within the budget: a clear library error, counted apart) and
  cases slower than the hang threshold.

Determinism: a sample of cases is searched again in a second process and
the schedules compared byte for byte.

``run(args)`` returns the figures and writes ``<output>`` (JSON) when set.
Nothing here reads flags.
"""

from __future__ import annotations

import json
import random
import subprocess
import sys
import time
import traceback
from collections.abc import Sequence
from typing import Any, NamedTuple

from tessel_jax import validate
from tessel_jax.graph import Block, BlockGraph, Edge
from tessel_jax.schedule import UnrolledSchedule
from tessel_jax.search import (CompletionError, InfeasibleScheduleError,
                               SearchTimeoutError, search_repetend)

RUNNER = "fuzz"


class FuzzArgs(NamedTuple):
  """Everything ``fuzz_lib.run`` needs; see the flags for meanings."""

  cases: int = 100
  seed: int = 0
  time_limit: float = 2.0
  microbatches: tuple[int, ...] = (1, 2, 3, 5, 16)
  determinism_sample: int = 20
  hang_seconds: float = 60.0
  max_forwards: int = 8
  max_seconds: float = 0.0
  output: str | None = None


# --- random cases -------------------------------------------------------------


def random_graph(rng: random.Random, name: str = "fuzz",
                 max_forwards: int = 8) -> BlockGraph:
  """A random valid placement (2-16 blocks, 2-16 devices).

  Forward blocks form a chain with extra forward edges (a DAG); in training
  mode each forward ``F_i`` gets a backward ``B_i`` on the same devices
  whose memory releases what ``F_i`` allocated, with edges reversed.
  """
  train = rng.random() < 0.7
  forwards = (rng.randint(1, max_forwards) if train
              else rng.randint(2, 2 * max_forwards))
  devices = rng.randint(2, min(16, forwards * (2 if train else 1) + 1))
  devices = min(devices, forwards)  # every device needs a forward block
  devices = max(devices, 1)
  owners = [[i % devices] for i in range(forwards)]
  rng.shuffle(owners)
  for dev in owners:
    if devices > 1 and rng.random() < 0.25:  # a multi-device block
      extra = rng.sample(range(devices), rng.randint(1, min(3, devices - 1)))
      dev.extend(d for d in extra if d not in dev)
  blocks, edges = [], []
  for i in range(forwards):
    memory = rng.randint(1, 3) if train else 0
    blocks.append(Block(i, "F", rng.randint(1, 4), memory,
                        tuple(sorted(owners[i]))))
  fwd_edges = {(i, i + 1) for i in range(forwards - 1)}
  for _ in range(rng.randint(0, forwards)):
    a, b = sorted(rng.sample(range(forwards), 2)) if forwards > 1 else (0, 0)
    if a != b:
      fwd_edges.add((a, b))
  for a, b in sorted(fwd_edges):
    edges.append(Edge(a, b, rng.choice((0, 0, 0, 1, 2))))
  if train:
    for i in range(forwards):
      f = blocks[i]
      blocks.append(Block(forwards + i, "B", rng.randint(1, 6), -f.memory,
                          f.devices))
    edges.append(Edge(forwards - 1, 2 * forwards - 1, 0))
    for a, b in sorted(fwd_edges):
      edges.append(Edge(forwards + b, forwards + a, rng.choice((0, 0, 1))))
  return BlockGraph(name=name, num_devices=devices, blocks=tuple(blocks),
                    edges=tuple(edges))


def random_limit(rng: random.Random, graph: BlockGraph) -> int | None:
  """None (no limit) or a limit from 0 (infeasible in training) to loose."""
  if graph.is_inference or rng.random() < 0.2:
    return None
  loose = max(sum(b.memory for b in graph.blocks_on(d) if b.memory > 0)
              for d in range(graph.num_devices))
  return rng.randint(0, 2 * loose)


# --- the independent checker (DESIGN.md §3 only) ------------------------------


def independent_check(graph: BlockGraph, num_microbatches: int,
                      limit: int | None,
                      actions: Sequence[tuple[int, int, int]]) -> list[str]:
  """Problems of a schedule by DESIGN.md §3 alone (empty: valid).

  Args:
    graph: The placement.
    num_microbatches: N.
    limit: Per-device memory capacity (None: unlimited).
    actions: ``(block, microbatch, start)`` triples.
  """
  spans = {b.id: b.span for b in graph.blocks}
  devs = {b.id: b.devices for b in graph.blocks}
  mem = {b.id: b.memory for b in graph.blocks}
  start: dict[tuple[int, int], int] = {}
  problems = []
  for blk, mb, s in actions:
    if (blk, mb) in start:
      problems.append(f"block {blk} mb {mb} twice")
    if blk not in spans or not 0 <= mb < num_microbatches or s < 0:
      problems.append(f"bad action {(blk, mb, s)}")
    start[(blk, mb)] = s
  want = {(b, m) for b in spans for m in range(num_microbatches)}
  if set(start) != want:
    problems.append(f"{len(want - set(start))} actions missing")
    return problems
  busy: dict[int, list[tuple[int, int]]] = {}
  for (blk, mb), s in start.items():
    for d in devs[blk]:
      busy.setdefault(d, []).append((s, s + spans[blk]))
  for d, spans_on in busy.items():
    spans_on.sort()
    for (s0, e0), (s1, _) in zip(spans_on, spans_on[1:]):
      if s1 < e0:
        problems.append(f"device {d} runs two blocks at step {s1}")
  for e in graph.edges:
    for m in range(num_microbatches):
      if start[(e.dst, m)] < start[(e.src, m)] + spans[e.src] + e.delay:
        problems.append(f"edge {e.src}->{e.dst} mb {m} starts early")
  for b in spans:
    for m in range(1, num_microbatches):
      if start[(b, m)] <= start[(b, m - 1)]:
        problems.append(f"block {b} mb {m} not after mb {m - 1}")
  if limit is not None:
    for d in range(graph.num_devices):
      deltas: dict[int, int] = {}
      for (blk, _), s in start.items():
        if d in devs[blk]:
          deltas[s] = deltas.get(s, 0) + mem[blk]
      level = 0
      for s in sorted(deltas):
        level += deltas[s]
        if level > limit:
          problems.append(f"device {d} holds {level} > {limit} at step {s}")
          break
  return problems


def triples(unrolled: UnrolledSchedule) -> list[tuple[int, int, int]]:
  return [(a.block, a.microbatch, a.start) for a in unrolled.actions]


# --- one case -----------------------------------------------------------------


def run_case(index: int, args: FuzzArgs) -> dict[str, Any]:
  """Draws case ``index`` of seed ``args.seed``, searches and checks it."""
  rng = random.Random(f"{args.seed}:{index}")
  graph = random_graph(rng, f"fuzz{index}", args.max_forwards)
  limit = random_limit(rng, graph)
  allow_wrap = rng.random() < 0.5
  out: dict[str, Any] = {"case": index, "blocks": graph.num_blocks,
                         "devices": graph.num_devices, "limit": limit,
                         "wrap": allow_wrap, "invalid": [], "raw_error": None,
                         "infeasible": False, "recheck_failed": False,
                         "split_longer": [], "schedules": 0,
                         "timeout": None}
  t0 = time.perf_counter()
  try:
    try:
      sched = search_repetend(graph, limit, allow_wrap=allow_wrap,
                              time_limit_s=args.time_limit)
    except InfeasibleScheduleError as err:
      out["infeasible"] = True
      need = err.min_memory_limit
      out["claimed_min"] = need
      if need is None:
        out["recheck_failed"] = True
        return out
      limit = need
      sched = search_repetend(graph, need, allow_wrap=allow_wrap,
                              time_limit_s=args.time_limit)
    makespans = {}
    for n in args.microbatches:
      unrolled = sched.unroll(n)
      out["schedules"] += 1
      makespans[n] = unrolled.makespan
      mine = independent_check(graph, n, limit, triples(unrolled))
      try:
        validate.assert_valid(unrolled)
        theirs = []
      except validate.ScheduleValidationError as err:
        theirs = [str(err)]
      if mine or theirs:
        out["invalid"].append({"n": n, "independent": mine[:3],
                               "validate": theirs[:1]})
    for n in args.microbatches:
      for a in range(1, n):
        if a in makespans and n - a in makespans and (
            makespans[n] > makespans[a] + makespans[n - a]):
          out["split_longer"].append([n, a, makespans[n],
                                      makespans[a] + makespans[n - a]])
  except (SearchTimeoutError, CompletionError) as err:
    out["timeout"] = str(err)[:200]  # the library's own error, not raw
  except Exception as err:  # pylint: disable=broad-except
    out["raw_error"] = "".join(traceback.format_exception_only(
        type(err), err)).strip()[-300:]
  out["seconds"] = round(time.perf_counter() - t0, 3)
  return out


def fingerprint(index: int, args: FuzzArgs) -> str:
  """The schedule of case ``index`` as JSON (for the determinism check)."""
  rng = random.Random(f"{args.seed}:{index}")
  graph = random_graph(rng, f"fuzz{index}", args.max_forwards)
  limit = random_limit(rng, graph)
  allow_wrap = rng.random() < 0.5
  try:
    sched = search_repetend(graph, limit, allow_wrap=allow_wrap,
                            time_limit_s=args.time_limit)
  except InfeasibleScheduleError as err:
    return f"infeasible {err.min_memory_limit}"
  return sched.unroll(max(args.microbatches)).to_json(include_timing=False)


def other_process_fingerprints(indices: Sequence[int], args: FuzzArgs
                               ) -> list[str]:
  """:func:`fingerprint` of ``indices`` computed in a fresh process."""
  code = ("import json,sys; from experiments import fuzz_lib as F;"
          " a=F.FuzzArgs(**json.loads(sys.argv[1]));"
          " print(json.dumps([F.fingerprint(i, a) for i in"
          " json.loads(sys.argv[2])]))")
  spec = args._asdict()
  spec["microbatches"] = list(args.microbatches)
  proc = subprocess.run(
      [sys.executable, "-c", code, json.dumps(spec), json.dumps(list(indices))],
      capture_output=True, text=True, check=True)
  return json.loads(proc.stdout.strip().splitlines()[-1])


# --- the run ------------------------------------------------------------------


def run(args: FuzzArgs) -> dict[str, Any]:
  """Runs ``args.cases`` cases (fewer when ``args.max_seconds`` runs out
  first); returns the figures (and writes them)."""
  t0 = time.perf_counter()
  cases = []
  for i in range(args.cases):
    if args.max_seconds and time.perf_counter() - t0 > args.max_seconds:
      break  # out of time: report the cases run so far
    cases.append(run_case(i, args))
  done = len(cases)
  sample = list(range(0, done, max(1, done // max(1, args.determinism_sample))))
  sample = sample[:args.determinism_sample]
  mismatched = []
  if sample:
    here = [fingerprint(i, args) for i in sample]
    there = other_process_fingerprints(sample, args)
    mismatched = [i for i, a, b in zip(sample, here, there) if a != b]
  seconds = [c["seconds"] for c in cases if "seconds" in c]
  result = {
      "runner": RUNNER,
      "args": {**args._asdict(), "microbatches": list(args.microbatches)},
      "cases": len(cases),
      "cases_asked": args.cases,
      "schedules_checked": sum(c["schedules"] for c in cases),
      "invalid": sum(bool(c["invalid"]) for c in cases),
      "raw_errors": sum(c["raw_error"] is not None for c in cases),
      "hangs": sum(s > args.hang_seconds for s in seconds),
      "search_timeouts": sum(c["timeout"] is not None for c in cases),
      "infeasible_claims": sum(c["infeasible"] for c in cases),
      "infeasible_recheck_failed": sum(c["recheck_failed"] for c in cases),
      "split_longer": sum(bool(c["split_longer"]) for c in cases),
      "determinism_sample": len(sample),
      "determinism_mismatches": mismatched,
      "max_case_seconds": max(seconds, default=0.0),
      "wall_seconds": round(time.perf_counter() - t0, 1),
      "failures": [c for c in cases if c["invalid"] or c["raw_error"]
                   or c["recheck_failed"] or c["split_longer"]][:20],
  }
  if args.output:
    with open(args.output, "w", encoding="utf-8") as f:
      json.dump(result, f, indent=1)
      f.write("\n")
  return result


def summary(result: dict[str, Any]) -> str:
  """The lines ``python -m experiments.fuzz`` prints."""
  return "\n".join([
      f"cases {result['cases']} of {result['cases_asked']}  schedules checked"
      f" {result['schedules_checked']}  wall {result['wall_seconds']} s"
      f" (slowest case {result['max_case_seconds']} s)",
      f"invalid {result['invalid']}  raw errors {result['raw_errors']}"
      f"  hangs {result['hangs']}  search timeouts (library error)"
      f" {result['search_timeouts']}",
      f"infeasible claims {result['infeasible_claims']} (re-check failed"
      f" {result['infeasible_recheck_failed']})",
      f"unroll(N) longer than unroll(a)+unroll(N-a): {result['split_longer']}",
      f"determinism: {len(result['determinism_mismatches'])} mismatches in"
      f" {result['determinism_sample']} cases re-run in a second process",
  ])
