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
process CPU seconds of one profile) and the load average before and after.
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
          "overhead_ms": 1e3 * over, "cpu_s": cpu}


def spread(values: Sequence[float]) -> dict[str, float]:
  """Median, cv (population sd over mean), min and max of ``values``."""
  mean = statistics.fmean(values)
  return {"median": statistics.median(values),
          "cv": statistics.pstdev(values) / mean if mean else 0.0,
          "min": min(values), "max": max(values)}


def spread_of(inputs: ProfileInputs, builds: int,
              fresh_overhead: bool) -> dict[str, Any]:
  """``builds`` profiles of ``inputs`` (:func:`profile_once`) and their
  spread."""
  runs = [profile_once(inputs, fresh_overhead) for _ in range(builds)]
  sums = [r["sum_ms"] for r in runs]
  s = spread(sums)
  return {"kernels": len(inputs.ks.kernels),
          "sums_ms": [round(x, 4) for x in sums],
          "median_ms": round(s["median"], 4), "cv": round(s["cv"], 4),
          "range_ms": [round(s["min"], 4), round(s["max"], 4)],
          "overhead_ms": [round(r["overhead_ms"], 4) for r in runs],
          "cpu_s": round(statistics.median(r["cpu_s"] for r in runs), 3)}


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
      row = {"model": name, "fresh_overhead": args.fresh_overhead,
             **spread_of(model_inputs(name, args, mesh), args.builds,
                         args.fresh_overhead)}
      row["load"] = [round(load0, 2), round(os.getloadavg()[0], 2)]
      log(json.dumps(row))
  finally:
    if args.realtime:
      realtime.normal_priority()
