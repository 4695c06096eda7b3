"""A model's kernel profile re-taken in one process: its spread (no flags
here; see ``experiments.profile_spread``).

``cost="measured"`` prices a step from its kernels' profiles
(``cost.measure.profile_kernels``). Between zoo runs those profiles moved
with a cv of 0.08-0.13 (the per-micro-batch sum of a model's kernels,
zoo14, session 38), and the prediction with them. This runner tells how
much of that one process's re-profiles show: each model is built once
(2 fake single-threaded CPU devices, ``vshape(2)``, ``cut="auto"``,
``cost="measured"``) with the profile's inputs captured, then its kernels
are profiled ``builds`` times from scratch (``memo={}``, no disk cache),
as a fresh build would; with ``fresh_overhead`` the call overhead taken
off each kernel (``call_timing.call_overhead``, measured once per process)
is measured again before each, as in a new process.

Per model, one JSON line: ``sums_ms`` (each profile's sum of the kernels'
seconds, ms per micro-batch), their ``median_ms``, ``cv`` (population
standard deviation over mean) and range, ``overhead_ms`` (per profile: the
call overhead taken off, summed over the kernels), ``cpu_s`` (the median
process CPU seconds of one profile), ``kernel_ms`` (each kernel's median)
and the load average before and after. With ``fused_pairs`` every build
profiles twice, ``cost.fused_grads`` off and on, and the line holds one
such spread per pricing (``old``, ``fused``).
"""

from __future__ import annotations

import json
import os
import statistics
import tempfile
import time
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import jax
import numpy as np

import tessel_jax as tj
from experiments import realtime
from experiments.fused_grads_ab_lib import PRICINGS, switch
from experiments.model_zoo_models import BUILDERS
from tessel_jax.cost import call_timing, measure


class ProfileInputs(NamedTuple):
  """What ``measure.profile_kernels`` was called with in a build."""

  ks: Any
  graph: Any
  param_avals: Sequence[Any]
  device: Any
  part: Any = None
  hoisted: frozenset[int] = frozenset()
  repeats: int = 5


def captured_inputs(build: Callable[[], Any]) -> ProfileInputs:
  """The inputs of the first profile ``build()`` takes.

  Raises:
    ValueError: where the build profiled nothing (not ``cost="measured"``).
  """
  got: list[ProfileInputs] = []
  real = measure.profile_kernels

  def spy(ks, graph, param_avals, device, **kw):
    if not got:
      got.append(ProfileInputs(ks, graph, param_avals, device,
                               kw.get("part"),
                               kw.get("hoisted", frozenset()),
                               kw.get("repeats", 5)))
    return real(ks, graph, param_avals, device, **kw)

  measure.profile_kernels = spy
  try:
    build()
  finally:
    measure.profile_kernels = real
  if not got:
    raise ValueError("profile_spread: the build profiled no kernels; build"
                     " it with cost='measured'")
  return got[0]


def profile_once(inputs: ProfileInputs, fresh_overhead: bool
                 ) -> dict[str, float]:
  """One profile of ``inputs`` from scratch: the kernels' sum and the
  call overhead taken off (ms per micro-batch) and its CPU seconds."""
  if fresh_overhead:
    call_timing._OVERHEAD.clear()  # pylint: disable=protected-access
  memo: dict[str, dict[str, Any]] = {}
  c0 = time.process_time()
  prof = measure.profile_kernels(
      inputs.ks, inputs.graph, inputs.param_avals, inputs.device, memo=memo,
      part=inputs.part, hoisted=inputs.hoisted, repeats=inputs.repeats)
  cpu = time.process_time() - c0
  over = sum(max(0.0, memo[k.key]["raw_seconds"] - memo[k.key]["seconds"])
             for k in prof.kernels.values())
  return {"sum_ms": 1e3 * sum(k.seconds for k in prof.kernels.values()),
          "overhead_ms": 1e3 * over, "cpu_s": cpu,
          "kernel_ms": {k.label: 1e3 * k.seconds
                        for k in prof.kernels.values()}}


def spread(values: Sequence[float]) -> dict[str, float]:
  """Median, cv (population sd over mean), min and max of ``values``."""
  mean = statistics.fmean(values)
  return {"median": statistics.median(values),
          "cv": statistics.pstdev(values) / mean if mean else 0.0,
          "min": min(values), "max": max(values)}


def summary(inputs: ProfileInputs, runs: Sequence[dict[str, Any]]
            ) -> dict[str, Any]:
  """The spread of ``runs`` (:func:`profile_once` results of ``inputs``)
  and each kernel's median ms."""
  sums = [r["sum_ms"] for r in runs]
  s = spread(sums)
  labels = runs[0]["kernel_ms"]
  return {"kernels": len(inputs.ks.kernels),
          "sums_ms": [round(x, 4) for x in sums],
          "median_ms": round(s["median"], 4), "cv": round(s["cv"], 4),
          "range_ms": [round(s["min"], 4), round(s["max"], 4)],
          "overhead_ms": [round(r["overhead_ms"], 4) for r in runs],
          "cpu_s": round(statistics.median(r["cpu_s"] for r in runs), 3),
          "kernel_ms": {l: round(statistics.median(
              r["kernel_ms"][l] for r in runs), 4) for l in labels}}


def spread_of(inputs: ProfileInputs, builds: int,
              fresh_overhead: bool) -> dict[str, Any]:
  """``builds`` profiles of ``inputs`` (:func:`profile_once`) and their
  spread."""
  return summary(inputs, [profile_once(inputs, fresh_overhead)
                          for _ in range(builds)])


def paired_spread(inputs: ProfileInputs, builds: int, fresh_overhead: bool
                  ) -> dict[str, Any]:
  """``builds`` rounds, each a profile of ``inputs`` with the fused-gradient
  pricing off and one with it on (``cost.fused_grads``; the order
  alternating by round): each pricing's spread."""
  runs: dict[str, list[dict[str, Any]]] = {w: [] for w in PRICINGS}
  for i in range(builds):
    order = list(PRICINGS) if i % 2 == 0 else list(PRICINGS)[::-1]
    for which in order:
      with switch(PRICINGS[which]):
        runs[which].append(profile_once(inputs, fresh_overhead))
  return {w: summary(inputs, r) for w, r in runs.items()}


def model_inputs(name: str, args: Any, mesh: Any) -> ProfileInputs:
  """Model ``name`` built as ``model_zoo_spans`` builds it (fresh cache),
  its profile's inputs captured."""
  model = BUILDERS[name](args.rows * args.microbatches)
  step = tj.schedule(model.fn, mesh=mesh, placement=tj.placements.vshape(2),
                     num_microbatches=args.microbatches,
                     has_aux=model.has_aux, cut="auto", cost="measured",
                     seed=0, cache_dir=tempfile.mkdtemp())
  return captured_inputs(lambda: step.build(model.params, model.batch))


def main(args: Any, log: Callable[[str], None] = print) -> None:
  """One JSON line per model (see the module doc)."""
  mesh = jax.sharding.Mesh(np.array(jax.devices()[:2]), ("pipe",))
  if args.realtime:
    realtime.realtime_threads()
  try:
    for name in args.models:
      load0 = os.getloadavg()[0]
      spread_fn = paired_spread if args.fused_pairs else spread_of
      row = {"model": name, "fresh_overhead": args.fresh_overhead,
             **spread_fn(model_inputs(name, args, mesh), args.builds,
                         args.fresh_overhead)}
      row["load"] = [round(load0, 2), round(os.getloadavg()[0], 2)]
      log(json.dumps(row))
  finally:
    if args.realtime:
      realtime.normal_priority()
