"""A scheduled step's schedule: given, classic (``search.baselines``),
cached or searched under the memory limit, and (measured costs) the other
candidates ``schedule_choice`` prices against it.

Every function takes the ``ScheduledFunction`` (``step``) whose options it
reads; failures are ``step._error`` messages naming the fix.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

from tessel_jax import checks as _checks
from tessel_jax import compat
from tessel_jax import schedule_cache as _schedule_cache
from tessel_jax import schedule_choice as _choice
from tessel_jax.cost import quantize as _quantize
from tessel_jax.graph import BlockGraph
from tessel_jax.hand_placement import SPANS
from tessel_jax.schedule import (SPLIT_MICROBATCHES, Schedule,
                                 UnrolledSchedule)

try:  # installed: passes/ is tessel_jax.passes
  from tessel_jax.passes import errors as _errors  # type: ignore
except ImportError:  # run from the repository root
  from passes import errors as _errors  # type: ignore

MEMORY_UNITS = 16  # the largest block's stash is this many memory units

#: Share of a cheap screening build's CP-SAT budget that each completion of
#: an ``N`` below the templates gets (``search_repetend``'s
#: ``completion_time_s``; full builds keep the search's default, at least
#: 1 deterministic s each). ``unroll(8)`` completes ``N = 8`` and, for its
#: splits ``a + (8 - a)``, every smaller ``N``: up to 8 solves, so together
#: they get about the search's own budget instead of 8 times it. README
#: GPT, 4 devices, cold ``placement="auto"``: the screening builds of mllm
#: and zbv pipe4 x dp1 spent ~6.5 s CPU in these solves at 1 s each.
SCREEN_COMPLETION_SHARE = 1 / SPLIT_MICROBATCHES


class InfeasibleMemory(Exception):
  """Internal: the search found no schedule under the memory limit."""


def initial_keep(step: Any, num_blocks: int) -> dict[int, bool]:
  """Forward block -> keeps its activations (False: recomputes them)."""
  r = step.recompute
  if r is None or r is False:
    return {i: True for i in range(num_blocks)}
  if r is True:
    return {i: False for i in range(num_blocks)}
  chosen = {int(i) for i in r}
  return {i: i not in chosen for i in range(num_blocks)}


def uniform_graph(graph: BlockGraph, ks: Any) -> tuple[BlockGraph, int]:
  """The placement with uniform spans and stash bytes in memory units."""
  by_fwd = {}
  for k in ks.kernels.values():
    if k.kind == "F":
      by_fwd[k.fwd] = k.stash_bytes
  biggest = max(by_fwd.values(), default=0)
  unit = max(1, math.ceil(biggest / MEMORY_UNITS))
  has_w = {k.fwd for k in ks.kernels.values() if k.kind == "W"}
  blocks = []
  for blk in graph.blocks:
    k = ks.kernels.get(blk.id)
    fwd = k.fwd if k is not None else None
    units = math.ceil(by_fwd.get(fwd, 0) / unit) if fwd is not None else 0
    if blk.kind == "F":
      mem = units
    elif blk.kind == "B":
      mem = 0 if fwd in has_w else -units
    else:
      mem = -units
    blocks.append(dataclasses.replace(blk, span=SPANS[blk.kind], memory=mem))
  return dataclasses.replace(graph, blocks=tuple(blocks)), unit


def memory_limit(step: Any) -> int | None:
  """Bytes per device ``step`` may use: its ``memory_limit``, or what the
  device reports (None: no limit)."""
  if step.memory_limit is not None:
    return step.memory_limit
  return compat.device_memory_limit(step.mesh.devices.flat[0])


def memory_limit_bytes(step: Any, layout: Any, costs: Any = None,
                       hoisted: int = 0) -> int | None:
  """Bytes per device left for the stash (None: no limit).

  :func:`memory_limit` less the parameters, their gradient accumulators
  and ``optimizer_slots`` parameter-sized optimiser arrays, ``hoisted``
  bytes (the kernels' parameter-only values computed before the ticks,
  ``passes.hoist``) and (measured costs) the largest kernel workspace (XLA
  temp bytes).
  """
  limit = memory_limit(step)
  if limit is None:
    return None
  fixed = max(layout.fixed_bytes_per_device(int(step.optimizer_slots)))
  fixed += hoisted
  if costs is not None:
    fixed += costs.workspace_bytes
  return max(0, int(limit) - fixed)


def memory_units(step: Any, unit: int, layout: Any, costs: Any = None,
                 hoisted: int = 0) -> int | None:
  """The stash limit in memory units of ``unit`` bytes (None: no limit)."""
  limit = memory_limit_bytes(step, layout, costs, hoisted)
  if limit is None:
    return None
  # Above this many units every quantised graph is effectively unlimited.
  return min(limit // unit, _checks.MAX_MEMORY_LIMIT)


def find_schedule(step: Any, graph: BlockGraph, unit: int, layout: Any,
                  n_local: int, costs: Any = None, hoisted: int = 0,
                  time_limit_s: float | None = None
                  ) -> tuple[Schedule | None, UnrolledSchedule]:
  """``(schedule, unrolled)`` of ``n_local`` micro-batches on ``graph``:
  ``step.plan`` when given, else cached or searched (``hoisted``: see
  :func:`memory_limit_bytes`; ``time_limit_s``: the search's CP-SAT
  budget, None: ``step.solver_time_limit_s``).

  Raises:
    InfeasibleMemory: no schedule fits the memory limit.
  """
  given = _given_schedule(step, graph, n_local)
  if given is not None:
    return given
  limit = memory_units(step, unit, layout, costs, hoisted)
  cache = _schedule_cache.ScheduleCache(step.cache_dir)
  if time_limit_s is None:
    time_limit_s = step.solver_time_limit_s
  options = {"time_limit_s": time_limit_s, "seed": step.seed}
  completion_s = completion_time_s(step)
  if completion_s is not None:  # (full builds keep their keys)
    options["completion_time_s"] = completion_s
  key = _schedule_cache.schedule_key(graph, limit, n_local, options)
  hit = cache.load(key, graph, n_local, limit)
  if hit is not None:
    step.schedule_cache_hits += 1
    return hit
  step.searches += 1
  sched = _search(step, graph, limit, unit, time_limit_s)
  unrolled = sched.unroll(n_local)
  cache.store(key, sched, unrolled)
  return sched, unrolled


def _given_schedule(step: Any, graph: BlockGraph, n_local: int
                    ) -> tuple[Schedule | None, UnrolledSchedule] | None:
  """``step.plan`` (a schedule or a classic one by name) on ``graph``;
  None when ``plan`` is None (search)."""
  plan = step.plan
  if isinstance(plan, UnrolledSchedule):
    if plan.num_microbatches != n_local:
      raise step._error(  # pylint: disable=protected-access
          f"the given schedule has {plan.num_microbatches} micro-batches but"
          f" each pipeline runs {n_local}")
    return None, dataclasses.replace(plan, graph=graph)
  if isinstance(plan, Schedule):
    sched = dataclasses.replace(plan, graph=graph)
    return sched, sched.unroll(n_local)
  if isinstance(plan, str):
    from tessel_jax.search import baselines  # pylint: disable=import-outside-toplevel
    try:
      return None, baselines.run(plan, graph, n_local)
    except ValueError as err:
      raise step._error(str(err)) from None  # pylint: disable=protected-access
  return None


def completion_time_s(step: Any) -> float | None:
  """Deterministic seconds of each small-``N`` completion of ``step``'s
  search: :data:`SCREEN_COMPLETION_SHARE` of its budget in a cheap
  screening build (``plans.FrontierFunction``), else None (the search's
  default)."""
  if not getattr(step, "cheap_screening", False):
    return None
  return step.solver_time_limit_s * SCREEN_COMPLETION_SHARE


def _search(step: Any, graph: BlockGraph, limit: int | None,
            unit: int, time_limit_s: float) -> Schedule:
  """``search.search_repetend`` with ``time_limit_s`` and the step's seed
  (and :func:`completion_time_s`)."""
  from tessel_jax import search  # pylint: disable=import-outside-toplevel
  try:
    return search.search_repetend(graph, memory_limit=limit,
                                  time_limit_s=time_limit_s,
                                  seed=step.seed,
                                  completion_time_s=completion_time_s(step))
  except search.InfeasibleScheduleError as err:
    need = err.min_memory_limit
    extra = (f"; the stash needs at least {need * unit} bytes per device"
             f" beyond parameters, gradients, optimiser state"
             f" (optimizer_slots={step.optimizer_slots}) and kernel"
             f" workspace" if need else "")
    raise InfeasibleMemory(
        f"no schedule fits the memory limit {step.memory_limit} bytes per"
        f" device{extra}. Raise memory_limit, or recompute activations"
        f" (recompute=True or a list of blocks)") from None


def uniform_candidate(step: Any, graph: BlockGraph, ks: Any, unit: int,
                      layout: Any, n_local: int, costs: Any,
                      hoisted: int = 0) -> Any:
  """``(graph, schedule, unrolled)`` searched on uniform spans under the
  same memory limit, or None when there is none."""
  alt_graph, alt_unit = uniform_graph(graph, ks)
  if alt_unit != unit:
    return None
  try:
    alt_sched, alt_unrolled = find_schedule(step, alt_graph, unit, layout,
                                            n_local, costs, hoisted)
  except (InfeasibleMemory, _errors.TesselError):
    return None
  return alt_graph, alt_sched, alt_unrolled


#: ``coarse_candidate``'s share of the step's CP-SAT budget. peer_bench's
#: 4-stage mshape at load 17: a coarse grid's search ran its whole 30 s
#: (the default grid's took 1.9 s) and lost; where it won (loaded builds)
#: the search and its price took 2.5-4.9 s.
COARSE_SEARCH_SHARE = 1 / 8


def coarse_candidate(step: Any, costs: Any, unit: int, layout: Any,
                     n_local: int, hoisted: int = 0) -> Any:
  """``(graph, schedule, unrolled)`` searched on the measured spans
  re-quantised on a coarser grid (``cost.quantize.coarser``; with the
  ``aligned_grid`` switch ``cost.quantize.aligned`` first) under the
  same memory limit, or None: no coarser grid, a resolution the user gave,
  a cheap screening build (``plans.FrontierFunction``: one more CP-SAT
  search in each of the cold choice's many screening builds; the full
  builds of the leaders search it), or no schedule."""
  if (step._costs.time_resolution is not None or  # pylint: disable=protected-access
      getattr(step, "cheap_screening", False)):
    return None
  coarse = (_quantize.aligned(costs.quantized)
            if step.switches.aligned_grid else None)
  if coarse is None:
    coarse = _quantize.coarser(costs.quantized)
  if coarse is None:
    return None
  try:
    sched, unrolled = find_schedule(
        step, coarse, unit, layout, n_local, costs, hoisted,
        time_limit_s=step.solver_time_limit_s * COARSE_SEARCH_SHARE)
  except (InfeasibleMemory, _errors.TesselError):
    return None
  return coarse, sched, unrolled


def candidates(step: Any, graph: BlockGraph, ks: Any, unit: int,
               layout: Any, n_local: int, costs: Any, hoisted: int = 0
               ) -> list[_choice.Candidate]:
  """The schedules a measured build may lower instead of the one searched
  on the measured spans (``schedule_choice.choose`` prices them in this
  order): the same spans on a coarser grid (:func:`coarse_candidate`,
  with the ``coarse_grid`` switch), then uniform spans
  (:func:`uniform_candidate`). Each is searched only when its turn
  comes."""
  out = []
  if step.switches.coarse_grid:
    out.append(_choice.Candidate(
        "coarse", "coarser measured spans",
        lambda: coarse_candidate(step, costs, unit, layout, n_local,
                                 hoisted)))
  out.append(_choice.Candidate(
      "uniform", "uniform spans",
      lambda: uniform_candidate(step, graph, ks, unit, layout, n_local,
                                costs, hoisted)))
  return out


def search_note(sched: Schedule | None, unrolled: UnrolledSchedule,
                searched: bool) -> str:
  """What the search phase did, for its progress line."""
  if sched is None:
    return f"{unrolled.source}, makespan {unrolled.makespan}"
  how = "searched" if searched else "from the schedule cache"
  return f"{how}, period {sched.period}, makespan {unrolled.makespan}"
