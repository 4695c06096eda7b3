"""Time/memory frontier of training plans (TensorOpt-style); no jax here.

Given a model as per-layer costs (:class:`ModelCosts`, defined in
``model_costs``: seconds of the forward and backward of each layer for one
micro-batch, bytes it stashes for the backward, its parameter bytes and the
bytes it hands to the next layer) and a device count, :func:`sweep`
enumerates *plans*:

* a named placement (``vshape``, ``interleaved``, ``mshape``, ``kshape``,
  ``xshape``, ``mllm``, ...; :data:`SUPPORTED`) on ``pipe`` devices per
  pipeline;
* ``dp = devices / pipe`` data-parallel replicas of that pipeline: each
  replica runs ``microbatches / dp`` of the micro-batches and holds a full
  copy of its parameters; the gradients are all-reduced once per step;
* a memory case: no limit (``loose``), the smallest limit any schedule
  fits (``tight``), levels in between, and absolute byte limits.

Every plan builds the placement's :class:`BlockGraph` with the layers'
costs (below), quantises it (``tessel_jax.cost.quantize``: integer spans,
memory units, edge delays), searches a repetend under the memory limit
(``search_repetend``), unrolls it for the pipeline's micro-batches, checks
it (``validate.assert_valid``) and replays it with the real seconds and
bytes (``tessel_jax.cost.predict``). Its figures are the step time in
seconds (the replay plus the gradient all-reduce) and the peak memory per
device in bytes (parameters, gradients and ``optimizer_slots``
parameter-sized optimiser arrays, plus the peak stash). Optionally the
classic baselines that fit a placement (1F1B, GPipe, ...) are evaluated the
same way. :func:`pareto_indices` gives the plans no other plan beats in both
step time and memory, :func:`choose` the fastest plan whose peak fits a
device's memory.

How a placement runs a chain of layers, and how a plan is priced, is
in ``plan_graph`` (:func:`plan_graph`).

The analytic preset (:func:`gpt_costs`, :data:`PRESETS`) prices a GPT
(embedding, transformer layers, untied output head) from flops and bytes;
``experiments.frontier`` can instead measure the layers on the real backend.
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from tessel_jax import validate
from tessel_jax.cost import predict as _predict
from tessel_jax.cost.link import LinkModel
from tessel_jax.graph import PlacementError
from tessel_jax.schedule import UnrolledSchedule
from tessel_jax.search import baselines as _baselines
from tessel_jax.search.completion import CompletionError
from tessel_jax.search.model_costs import (PRESETS, GPTConfig, LayerCost,
                                           ModelCosts, gpt_costs)
from tessel_jax.search.plan_graph import (DEFAULT_LINK, SUPPORTED, PlanGraph,
                                          plan_graph)
from tessel_jax.search.errors import (InfeasibleScheduleError,
                                      SearchTimeoutError)
from tessel_jax.search.min_memory import smallest_memory
from tessel_jax.search.repetend import search_repetend

#: Placements of the default sweep.
DEFAULT_PLACEMENTS = ("vshape", "interleaved", "mshape", "kshape", "xshape",
                      "mllm")

# --- one plan's figures -------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class PlanResult:
  """One plan and its figures.

  Attributes:
    placement: Placement name.
    pipe: Devices per pipeline.
    dp: Data-parallel replicas.
    stages: Forward blocks of the placement.
    groups: Layer names per forward group.
    microbatches: Micro-batches per pipeline.
    memory_case: ``loose``, ``tight``, ``level0.5``, ``limit16GiB`` (a
      device memory, :func:`size_label`) or ``baseline``.
    memory_limit_units: Stash limit the search ran under (None: none).
    stash_limit_bytes: The same in bytes.
    source: Who made the schedule (``tessel``, ``tessel-list``, ``1f1b``...).
    status: Search status of the period (``OPTIMAL``, ``FEASIBLE``;
      ``BASELINE`` for baselines).
    period: Period in steps (None for non-periodic schedules).
    makespan_steps: Makespan of the integer schedule.
    resolution_s: Seconds per step.
    memory_unit_bytes: Bytes per memory unit.
    step_seconds: Predicted step time (pipeline + all-reduce).
    pipeline_seconds: The replay of the schedule with real durations.
    allreduce_seconds: Gradient all-reduce time.
    bubble_ratio: Idle share of the pipeline replay.
    peak_bytes: Largest per-device peak (fixed + stash).
    peak_bytes_per_device: Per device of one pipeline.
    fixed_bytes: Largest per-device parameters + gradients + optimiser +
      workspace.
    stash_peak_bytes: Largest per-device peak stash.
    search_seconds: Wall seconds of the search (0 for baselines).
    memory_limit_bytes: The device memory of a ``limit`` case (else None).
  """

  placement: str
  pipe: int
  dp: int
  stages: int
  groups: tuple[str, ...]
  microbatches: int
  memory_case: str
  memory_limit_units: int | None
  stash_limit_bytes: int | None
  source: str
  status: str
  period: int | None
  makespan_steps: int
  resolution_s: float
  memory_unit_bytes: int
  step_seconds: float
  pipeline_seconds: float
  allreduce_seconds: float
  bubble_ratio: float
  peak_bytes: int
  peak_bytes_per_device: tuple[int, ...]
  fixed_bytes: int
  stash_peak_bytes: int
  search_seconds: float
  memory_limit_bytes: int | None = None

  @property
  def label(self) -> str:
    """E.g. ``mshape pipe4 dp2 tight`` or ``vshape pipe8 dp1 1f1b``."""
    case = self.source if self.memory_case == "baseline" else self.memory_case
    return f"{self.placement} pipe{self.pipe} dp{self.dp} {case}"

  def to_dict(self) -> dict[str, Any]:
    out = dataclasses.asdict(self)
    out["groups"] = list(self.groups)
    out["peak_bytes_per_device"] = list(self.peak_bytes_per_device)
    out["label"] = self.label
    return out

  @classmethod
  def from_dict(cls, data: Mapping[str, Any]) -> "PlanResult":
    fields = {f.name for f in dataclasses.fields(cls)}
    kw = {k: v for k, v in data.items() if k in fields}
    kw["groups"] = tuple(kw["groups"])
    kw["peak_bytes_per_device"] = tuple(kw["peak_bytes_per_device"])
    return cls(**kw)


def evaluate(pg: PlanGraph, unrolled: UnrolledSchedule, *, memory_case: str,
             memory_limit_units: int | None, status: str,
             search_seconds: float = 0.0,
             memory_limit_bytes: int | None = None) -> PlanResult:
  """Checks ``unrolled`` and replays it with ``pg``'s real costs.

  Raises:
    ScheduleValidationError: if the schedule breaks a rule (dependencies,
      device overlap, order, or the memory limit it claims).
  """
  validate.assert_valid(unrolled)
  q = pg.quantized
  pred = _predict.predict(unrolled, q.seconds, delays=q.delay_seconds,
                          memory_bytes=q.memory_bytes)
  peaks = tuple(int(f + s) for f, s in zip(pg.fixed_bytes, pred.peak_bytes))
  unit = q.memory_unit
  return PlanResult(
      placement=pg.placement, pipe=pg.pipe, dp=pg.dp,
      stages=sum(1 for b in pg.graph.blocks if b.kind == "F"),
      groups=pg.group_names, microbatches=pg.microbatches,
      memory_case=memory_case, memory_limit_units=memory_limit_units,
      stash_limit_bytes=(None if memory_limit_units is None
                         else memory_limit_units * unit),
      source=unrolled.source, status=status, period=unrolled.period,
      makespan_steps=unrolled.makespan, resolution_s=q.resolution,
      memory_unit_bytes=unit,
      step_seconds=pred.step_seconds + pg.allreduce_seconds,
      pipeline_seconds=pred.step_seconds,
      allreduce_seconds=pg.allreduce_seconds,
      bubble_ratio=round(pred.bubble_ratio, 6), peak_bytes=max(peaks),
      peak_bytes_per_device=peaks, fixed_bytes=max(pg.fixed_bytes),
      stash_peak_bytes=max(pred.peak_bytes),
      search_seconds=round(search_seconds, 4),
      memory_limit_bytes=memory_limit_bytes)


# --- Pareto set and choice ----------------------------------------------------

def pareto_indices(points: Sequence[tuple[float, float]]) -> tuple[int, ...]:
  """Indices of the points no other point beats in both coordinates.

  A point is dominated when another is no worse in both coordinates and
  strictly better in one; equal points do not dominate each other, so all
  copies of a Pareto point are kept. Returned by increasing first
  coordinate (then second, then index).
  """
  order = sorted(range(len(points)), key=lambda i: (points[i][0],
                                                    points[i][1], i))
  out: list[int] = []
  best_second = math.inf
  last: tuple[float, float] | None = None
  for i in order:
    p = (points[i][0], points[i][1])
    if p == last or p[1] < best_second:
      out.append(i)
      best_second = min(best_second, p[1])
      last = p
  return tuple(out)


def choose(plans: Sequence[PlanResult], limit_bytes: int | None) -> int | None:
  """Index of the fastest plan whose peak fits ``limit_bytes`` (ties: the
  smaller peak, then the earlier plan); None if none fits."""
  fits = [i for i, p in enumerate(plans)
          if limit_bytes is None or p.peak_bytes <= limit_bytes]
  if not fits:
    return None
  return min(fits, key=lambda i: (plans[i].step_seconds, plans[i].peak_bytes,
                                  i))


@dataclasses.dataclass(frozen=True)
class Frontier:
  """Every plan of a sweep, its Pareto set and the chosen plan.

  Attributes:
    plans: Every evaluated plan.
    pareto: Indices into ``plans`` of the Pareto set (by step time).
    chosen: Index of the plan chosen for ``memory_limit_bytes`` (None:
      nothing fits).
    memory_limit_bytes: Device memory the choice was made for.
    skipped: ``(what, why)`` for configurations and memory cases that gave
      no plan (unsupported device count, infeasible limit, ...).
  """

  plans: tuple[PlanResult, ...]
  pareto: tuple[int, ...]
  chosen: int | None
  memory_limit_bytes: int | None
  skipped: tuple[tuple[str, str], ...] = ()

  def to_dict(self) -> dict[str, Any]:
    return {"plans": [p.to_dict() for p in self.plans],
            "pareto": list(self.pareto), "chosen": self.chosen,
            "memory_limit_bytes": self.memory_limit_bytes,
            "skipped": [list(s) for s in self.skipped]}


def frontier(plans: Sequence[PlanResult], memory_limit_bytes: int | None,
             skipped: Sequence[tuple[str, str]] = ()) -> Frontier:
  """The :class:`Frontier` of ``plans``."""
  plans = tuple(plans)
  return Frontier(
      plans=plans,
      pareto=pareto_indices([(p.step_seconds, p.peak_bytes) for p in plans]),
      chosen=choose(plans, memory_limit_bytes),
      memory_limit_bytes=memory_limit_bytes, skipped=tuple(skipped))


# --- the sweep ----------------------------------------------------------------

def size_label(nbytes: int) -> str:
  """``16GiB``, ``512MiB``, ``3KiB`` when exact, else ``1234567B``."""
  for unit, size in (("TiB", 2**40), ("GiB", 2**30), ("MiB", 2**20),
                     ("KiB", 2**10)):
    if nbytes >= size and nbytes % size == 0:
      return f"{nbytes // size}{unit}"
  return f"{nbytes}B"


def _divisors(n: int) -> list[int]:
  return [d for d in range(1, n + 1) if n % d == 0]


def _error(e: BaseException) -> str:
  return f"{type(e).__name__}: {e}"


def sweep(model: ModelCosts, devices: int, *,
          placements: Sequence[str] = DEFAULT_PLACEMENTS,
          pipes: Sequence[int] | None = None, microbatches: int = 32,
          memory_levels: Sequence[float] = (0.5,),
          memory_limits: Sequence[int] = (),
          memory_limit: int | None = None,
          link: LinkModel = DEFAULT_LINK, optimizer_slots: int = 2,
          shard_shared: bool = False, baselines: bool = True,
          time_limit_s: float = 2.0, seed: int = 0,
          log: Callable[[str], None] | None = None) -> Frontier:
  """Evaluates every plan and returns the frontier.

  For every placement and pipeline width ``pipe`` (a divisor of
  ``devices``; with ``pipe == 1`` only ``vshape``, every placement being the
  same single-device sequence there) with ``dp = devices / pipe``:

  1. the graph is priced (:func:`plan_graph`);
  2. the search runs with no limit (``loose``), then at the smallest limit
     that admits any schedule (``tight``), at each ``memory_levels``
     fraction between the two (``level<f>``), and under each absolute
     ``memory_limits`` and ``memory_limit`` (bytes per device:
     ``limit16GiB``); limits that give the same stash units as an earlier
     case are searched once;
  3. with ``baselines``, every classic baseline that fits the placement.

  Args:
    model: Per-layer costs.
    devices: Devices in all (``pipe x dp``).
    placements: Names from :data:`SUPPORTED`.
    pipes: Pipeline widths to try (default: every divisor of ``devices``).
    microbatches: Micro-batches per step in all (must divide by ``dp``;
      widths where it does not are skipped).
    memory_levels: Fractions in ``(0, 1)`` between the tight and the loose
      stash.
    memory_limits: Extra device memories in bytes to search under.
    memory_limit: The device memory the plan is chosen for (also searched
      under); None: choose the fastest plan.
    link: Communication model.
    optimizer_slots: Parameter-sized optimiser arrays (Adam: 2).
    shard_shared: Shard the parameters of multi-device blocks.
    baselines: Also evaluate the classic baselines that fit.
    time_limit_s: CP-SAT budget per search (deterministic seconds).
    seed: CP-SAT seed.
    log: Receives one line per plan (and per skipped case).

  Raises:
    ValueError: for an unknown placement, no device, or a bad level.
  """
  _check_sweep_args(devices, placements, memory_levels)
  out = _Collector(log or (lambda _s: None))
  limits = sorted(set(int(x) for x in memory_limits) |
                  ({int(memory_limit)} if memory_limit is not None else set()),
                  reverse=True)
  for pipe in list(pipes) if pipes is not None else _divisors(devices):
    if devices % pipe:
      out.skip(f"pipe{pipe}", f"{pipe} does not divide {devices} devices")
      continue
    dp = devices // pipe
    for name in placements:
      what = f"{name} pipe{pipe} dp{dp}"
      if pipe == 1 and name != "vshape":
        continue
      try:
        pg = plan_graph(model, name, pipe, dp, microbatches=microbatches,
                        link=link, optimizer_slots=optimizer_slots,
                        shard_shared=shard_shared)
      except (PlacementError, ValueError) as e:
        out.skip(what, str(e))
        continue
      _LimitSearch(pg, what, out, time_limit_s, seed).run(memory_levels,
                                                          limits)
      if baselines:
        _add_baselines(pg, what, out)
  return frontier(out.plans, memory_limit, out.skipped)


def _check_sweep_args(devices: int, placements: Sequence[str],
                      memory_levels: Sequence[float]) -> None:
  """Raises ``ValueError`` for :func:`sweep` arguments it cannot use."""
  if devices < 1:
    raise ValueError(f"devices must be >= 1, got {devices}")
  unknown = [p for p in placements if p not in SUPPORTED]
  if unknown:
    raise ValueError(f"placements {unknown} are not supported by the"
                     f" frontier; use {', '.join(SUPPORTED)}")
  bad = [f for f in memory_levels if not 0 < f < 1]
  if bad:
    raise ValueError(f"memory_levels must lie in (0, 1), got {bad}")


@dataclasses.dataclass
class _Collector:
  """The plans and skipped cases of one sweep, each logged as it comes."""
  say: Callable[[str], None]
  plans: list[PlanResult] = dataclasses.field(default_factory=list)
  skipped: list[tuple[str, str]] = dataclasses.field(default_factory=list)

  def skip(self, what: str, why: str) -> None:
    self.skipped.append((what, why))
    self.say(f"skip {what}: {why}")

  def add(self, result: PlanResult) -> None:
    self.plans.append(result)
    self.say(f"{result.label:<34} step {result.step_seconds * 1e3:9.2f} ms"
             f"  peak {result.peak_bytes / 2**30:8.3f} GiB  ({result.source},"
             f" {result.status}, search {result.search_seconds:.2f} s)")


@dataclasses.dataclass
class _LimitSearch:
  """The searches of one priced plan graph under its memory limits; a
  limit that gives the same stash units as an earlier one is searched
  once."""
  pg: PlanGraph
  what: str
  out: _Collector
  time_limit_s: float
  seed: int
  searched: dict[int | None, str] = dataclasses.field(default_factory=dict)

  def search(self, units: int | None, case: str,
             limit_bytes: int | None = None) -> int | None:
    """Searches one limit; returns the peak stash in units (None: searched
    before, or no schedule)."""
    if units in self.searched:
      return None
    self.searched[units] = case
    t0 = time.perf_counter()
    try:
      sched = search_repetend(self.pg.graph, units,
                              time_limit_s=self.time_limit_s, seed=self.seed)
      run = sched.unroll(self.pg.microbatches)
      result = evaluate(self.pg, run, memory_case=case,
                        memory_limit_units=units, status=sched.status,
                        search_seconds=time.perf_counter() - t0,
                        memory_limit_bytes=limit_bytes)
    except (InfeasibleScheduleError, SearchTimeoutError,
            CompletionError) as e:
      self.out.skip(f"{self.what} {case}", _error(e))
      return None
    self.out.add(result)
    return max(run.peak_memory)

  def run(self, memory_levels: Sequence[float], limits: Sequence[int]
          ) -> None:
    """``loose`` (no limit), ``tight`` (the smallest stash), the
    ``memory_levels`` between them and every limit in ``limits`` (bytes)."""
    loose_peak = self.search(None, "loose")
    tight, _ = smallest_memory(self.pg.graph, None,
                               time_limit_s=self.time_limit_s, seed=self.seed)
    if tight is not None and (loose_peak is None or tight < loose_peak):
      self.search(tight, "tight")
      if loose_peak is not None:
        for f in sorted(memory_levels, reverse=True):
          units = tight + int(round(f * (loose_peak - tight)))
          if tight < units < loose_peak:
            self.search(units, f"level{f:g}")
    for limit in limits:
      units = self.pg.stash_limit_units(limit)
      case = f"limit{size_label(limit)}"
      if units < 0 or (tight is not None and units < tight):
        self.out.skip(
            f"{self.what} {case}",
            f"nothing fits {size_label(limit)} per device (parameters,"
            f" gradients and optimiser state take {max(self.pg.fixed_bytes)}"
            f" bytes, the smallest stash {tight} units of"
            f" {self.pg.quantized.memory_unit} bytes)")
      elif loose_peak is None or units < loose_peak:
        self.search(units, case, limit)


def _add_baselines(pg: PlanGraph, what: str, out: _Collector) -> None:
  """Every classic baseline that fits ``pg``'s placement, evaluated."""
  for base in _baselines.for_placement(pg.graph):
    try:
      run = _baselines.run(base, pg.graph, pg.microbatches)
      out.add(evaluate(pg, run, memory_case="baseline",
                       memory_limit_units=None, status="BASELINE"))
    except ValueError as e:
      out.skip(f"{what} {base}", _error(e))
