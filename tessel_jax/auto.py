"""``placement="auto"``: price every plan (``tessel_jax.plans``), lower the
fastest predicted one that fits the memory limit, and say why."""

from __future__ import annotations

import dataclasses
import os
import time
from collections.abc import Sequence
from typing import Any

from tessel_jax import frontier_fit as _frontier_fit
from tessel_jax.plans import FrontierFunction, PricedPlan, ProgramFrontier


def _env_seconds(name: str, default: float) -> float:
  """A positive number of seconds from environment variable ``name``
  (``default`` when unset or empty)."""
  text = os.environ.get(name)
  if text is None or not text.strip():
    return default
  try:
    value = float(text)
  except ValueError:
    value = -1.0
  if not value > 0:
    raise ValueError(f"{name}={text!r}: expected a positive number of"
                     f" seconds (default {default})")
  return value


#: Screened plans built in full before choosing (``FrontierFunction``);
#: None: every plan is built in full. Screening runs both searches of each
#: plan (an earlier screening skipped the search on uniform spans, and its
#: prices came out far above the full build's: README GPT, 4 devices,
#: mshape pipe2 x dp2 over 300 ms screened, 117 ms in full) on a short
#: CP-SAT budget (:data:`SCREEN_TIME_LIMIT_S`) with the kernels not measured
#: yet estimated from their flops (:data:`SCREEN_ESTIMATE`); the
#: ``REFINE`` fastest fitting plans, then whichever fitting plan is
#: fastest until it is a full build, and every screened plan within
#: :data:`REFINE_MARGIN` of the fastest full build, are built again with
#: every kernel measured and the caller's budget.
REFINE = 1
#: Screened plans priced below ``1 + REFINE_MARGIN`` times the fastest full
#: build (a screened price first scaled by ``plans.full_scale``, the median
#: full / screened price of the plans built both ways) are built in full too. README GPT, 4 devices: screened prices
#: were 0.97-1.46x the full ones (estimated kernels, 1 s budget); with 0.1
#: the 6 MiB choice missed mllm pipe2 x dp2 (screened 73.5 ms, full 60.2 ms
#: against 64.3 ms for the plan chosen).
REFINE_MARGIN = 0.25
#: CP-SAT budget (deterministic seconds) of a screening build's searches
#: (``TESSEL_JAX_SCREEN_TIME_LIMIT_S`` sets another, e.g. 1.0, the budget
#: before session 42). README GPT, 4 devices, the screening searches of
#: one cold choice replayed at 1.0 and 0.5: the same unrolled makespan in
#: 16 of 16 unlimited and 32 of 32 at 6 MiB, 6.35 -> 2.81 CPU s unlimited
#: (interleaved pipe4: 2.7 -> 0.3 s; BENCHMARKS.md, helper "cold12").
SCREEN_TIME_LIMIT_S = _env_seconds("TESSEL_JAX_SCREEN_TIME_LIMIT_S", 0.5)
#: Screening builds estimate unmeasured kernels instead of compiling them.
SCREEN_ESTIMATE = True
#: Classic schedules also pay for the stash bytes they hold beyond the
#: searched plan whose build prices them (``FrontierFunction(price_stash=)``,
#: ``cost.stash_fill``). README GPT, 4 devices, unlimited, 15 rounds: without
#: it GPipe was chosen and measured 1.082x the searched plan in paired CPU
#: (1.087x wall); with it 1F1B, the cheapest of the four measured; the memory
#: limits and two zoo models chose the same plan either way (BENCHMARKS.md,
#: helper "pick3", session 32; ``experiments.auto_plan --noprice_stash``).
PRICE_STASH = True
#: The fastest fitting plan and the fastest priced on another stand-in
#: program, when within ``paired_standins.MARGIN``, are re-priced from
#: their stand-ins timed side by side (``FrontierFunction(
#: paired_standins=)``): one stand-in timing varies +-25% between windows
#: seconds apart, and hf_gpt2 at 4 devices chose interleaved (priced 0.92x
#: vshape) that measured 1.13x (BENCHMARKS.md, helpers "lim9" and "pick4",
#: session 33).
PAIRED_STANDINS = True
#: Screening skips the search of a plan whose lower bound on its screening
#: kernels (estimated ones included) is at least ``1 + REFINE_MARGIN``
#: times the fastest fitting screened price so far
#: (``FrontierFunction(screen_prune=)``): the refine would not build it.
#: README GPT, 4 devices: the zbv plans (bound 41.6 ms against 25.0-25.2
#: for the others, vshape pipe2 x dp2 screened at 29.9-30 ms).
#: ``TESSEL_JAX_SCREEN_PRUNE=0`` turns it off (the old path, for A/B).
SCREEN_PRUNE = os.environ.get("TESSEL_JAX_SCREEN_PRUNE", "1") != "0"


@dataclasses.dataclass(frozen=True)
class AutoChoice:
  """What ``placement="auto"`` chose and why.

  Attributes:
    winner: The plan lowered.
    runner_up: The fastest fitting plan of another placement, width or N.
    memory_limit: Bytes per device the choice fits (None: none).
    frontier: Every priced plan.
    choose_seconds: Wall seconds of pricing and choosing.
    step: The ``ScheduledFunction`` of the winner (what runs).
  """

  winner: PricedPlan
  runner_up: PricedPlan | None
  memory_limit: int | None
  frontier: ProgramFrontier
  choose_seconds: float
  step: Any = None

  def describe(self) -> str:
    w, r = self.winner, self.runner_up
    pruned = sum(1 for _, why in self.frontier.skipped
                 if why.startswith("Pruned"))
    extra = f", {pruned} pruned by their lower bound" if pruned else ""
    text = (f"placement='auto' chose {w.label} from {len(self.frontier.plans)}"
            f" plans{extra} in {self.choose_seconds:.1f} s: predicted step"
            f" {w.step:.3f} {w.unit}, peak {w.peak_bytes} bytes per device")
    if r is not None:
      text += (f"; runner-up {r.label}: {r.step:.3f} {r.unit}, peak"
               f" {r.peak_bytes} bytes")
    return text


def _schedule_options(step: Any) -> dict[str, Any]:
  """The ``tj.schedule`` options of ``step`` that every candidate shares."""
  names = ("solver_time_limit_s", "recompute", "seed", "max_loop_period",
           "param_layout", "interpret_ramps", "param_sharding", "cost",
           "time_resolution", "reprofile", "link", "cache_dir",
           "optimizer_slots", "cut", "has_aux", "data_axes", "fsdp")
  return {n: getattr(step, n) for n in names}


def auto_build(step: Any, params: Any, batch: Any,
               placements: Sequence[str] | None = None
               ) -> tuple[Any, AutoChoice]:
  """Prices every plan of ``step.fn`` on ``step.mesh``, picks the fastest
  predicted one whose peak fits ``step.memory_limit`` and builds it; a
  plan whose full build does not fit (a screened peak leaves out the
  kernel workspace) gives way to the next fitting one
  (``frontier_fit.build_fitting``).

  Returns:
    ``(Built, AutoChoice)``.

  Raises:
    TesselError: when no plan fits, naming the smallest limit that does.
  """
  t0 = time.perf_counter()
  n = step.num_microbatches
  ff = FrontierFunction(step.fn, mesh=step.mesh, placements=placements,
                        microbatches=None if n is None else [int(n)],
                        memory_limit=step.memory_limit,
                        pipe_axis=step.pipe_axis, mode=step.mode,
                        refine=REFINE, prune=True,
                        screen_time_limit_s=SCREEN_TIME_LIMIT_S,
                        screen_estimate=SCREEN_ESTIMATE,
                        refine_margin=REFINE_MARGIN,
                        price_stash=PRICE_STASH,
                        paired_standins=PAIRED_STANDINS,
                        screen_prune=SCREEN_PRUNE,
                        **_schedule_options(step))
  fitted = _frontier_fit.build_fitting(ff, ff(params, batch),
                                      step.memory_limit, params, batch)
  fr = fitted.frontier
  if fitted.winner is None:
    raise step._error(_nothing_fits(fr, step.memory_limit))  # pylint: disable=protected-access
  choice = AutoChoice(winner=fitted.winner,
                      runner_up=fr.runner_up(step.memory_limit),
                      memory_limit=step.memory_limit, frontier=fr,
                      choose_seconds=time.perf_counter() - t0,
                      step=fitted.step)
  built = fitted.built
  return built, choice


def _nothing_fits(fr: ProgramFrontier, limit: int | None) -> str:
  small = fr.smallest_peak()
  if small is None:
    reasons = "; ".join(f"{w}: {y}" for w, y in fr.skipped[:3])
    return (f"placement='auto' found no plan for this program on this mesh"
            f" ({len(fr.skipped)} candidates skipped, e.g. {reasons}); pick a"
            f" placement and tj.boundary markers by hand")
  return (f"placement='auto': none of the {len(fr.plans)} plans fits"
          f" memory_limit={limit} bytes per device; the smallest peak is"
          f" {small.peak_bytes} bytes ({small.label}). Pass memory_limit >="
          f" {small.peak_bytes}, or recompute=True to stash less")
