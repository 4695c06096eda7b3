"""The cost options of one scheduled function, from kernels to report.

:class:`CostModel` is what ``tessel_jax.schedule`` holds for ``cost=``,
``time_resolution=``, ``reprofile=``, ``link=``, ``cache_dir=`` and
``optimizer_slots=``: the options, what was measured once (``memo``) and
the methods the build calls, each done by a module with one job:

* :meth:`CostModel.search_graph`: profile the kernels, price the edges and
  quantise everything into the search's graph (``search_costs``, its link
  from ``link_choice``);
* :meth:`CostModel.predict`: replay the lowered schedule with the measured
  durations and the lowering's per-tick costs (``tick_pricing``),
  calibrated on the plan's stand-in program (``standin``);
* :meth:`CostModel.serial_seconds`: the FSDP collectives and the packing
  around the ticks (``serial``);
* :meth:`CostModel.report`: the :class:`CostReport` (``report_build``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from tessel_jax.cost import cache as _cache
from tessel_jax.cost import link as _link
from tessel_jax.cost import link_choice as _link_choice
from tessel_jax.cost import memo as _memo
from tessel_jax.cost import port_pricing as _port_pricing
from tessel_jax.cost import predict as _predict
from tessel_jax.cost import processes as _processes
from tessel_jax.cost import report_build as _report_build
from tessel_jax.cost import search_costs as _search_costs
from tessel_jax.cost import serial as _serial
from tessel_jax.cost import standin as _standin
from tessel_jax.cost import tick_pricing as _tick_pricing
from tessel_jax.cost import ticks as _ticks
from tessel_jax.cost.report import CostReport
from tessel_jax.cost.search_costs import SearchCosts, block_memory_bytes
from tessel_jax.graph import BlockGraph

__all__ = ["COSTS", "CostModel", "SearchCosts", "agree",
           "block_memory_bytes"]

COSTS = ("measured", "calibrated", "uniform")

_local_mesh = _processes.local_mesh
_single_process = _processes.single_process
agree = _processes.agree


def check_options(cost: str, time_resolution: float | None, link: Any,
                  optimizer_slots: int) -> None:
  """Raises ValueError naming the first bad :class:`CostModel` option."""
  if cost not in COSTS:
    raise ValueError(f"cost is {cost!r}; use 'measured' (profile every"
                     f" kernel on the device), 'calibrated' (measured, and"
                     f" the per-tick cost timed on each candidate program"
                     f" with stand-in kernels) or 'uniform' (spans F=1,"
                     f" B=2, W=1), or set the TESSEL_JAX_COST environment"
                     f" variable to one of them")
  if time_resolution is not None and not (
      isinstance(time_resolution, (int, float)) and time_resolution > 0):
    raise ValueError(f"time_resolution must be a number of seconds > 0 (or"
                     f" None for automatic), got {time_resolution!r}")
  if not (link is None or isinstance(link, _link.LinkModel) or
          link == "measure"):
    raise ValueError(f"link must be None (backend defaults), a"
                     f" tessel_jax.cost.LinkModel or 'measure', got"
                     f" {link!r}")
  if (isinstance(optimizer_slots, bool) or
      not isinstance(optimizer_slots, int) or optimizer_slots < 0):
    raise ValueError(f"optimizer_slots must be an integer >= 0 (Adam: 2),"
                     f" got {optimizer_slots!r}")


class CostModel:
  """Cost options of one ``ScheduledFunction`` (validated on creation).

  Raises:
    ValueError: for an unknown ``cost``, a non-positive ``time_resolution``,
      a ``link`` that is not None / LinkModel / "measure", or a negative
      ``optimizer_slots``.
  """

  def __init__(self, *, cost: str = "measured",
               time_resolution: float | None = None, reprofile: bool = False,
               link: Any = None, cache_dir: str | None = None,
               optimizer_slots: int = 0, repeats: int = 9):
    check_options(cost, time_resolution, link, optimizer_slots)
    self.cost = cost
    self.time_resolution = time_resolution
    self.link_option = link
    self.optimizer_slots = optimizer_slots
    self.repeats = repeats
    self.cache = _cache.ProfileCache(cache_dir, reprofile=reprofile)
    self.memo = _memo.CostMemo()
    self.tally = _memo.Tally()
    # Same dict as memo.standin (read by tests: one stand-in per plan).
    self._standin = self.memo.standin
    # Set by tessel_jax.plans for a screening build: unmeasured kernels are
    # estimated from their flops (cost.estimate) instead of compiled.
    self.estimator: Any = None
    # Set by the build: ``plan -> seconds`` compiling and timing the
    # lowered program of a plan (``calibrate.program_timer``); while set,
    # :meth:`predict` calibrates the tick model on each plan's stand-in
    # program (``calibrate``). None: the microbenchmark alone.
    self.time_program: Callable[[Any], float] | None = None
    # Set by the build: ``layout -> cost.outside.OutsideTimer`` of the step's
    # part outside its ticks (``cost.outside``), or None (not priced).
    self.time_outside: Callable[[Any], Any] | None = None
    # Set by tessel_jax.plans (placement="auto"): seconds of the fastest
    # fitting plan priced so far. A plan whose prediction *without* its
    # stand-in program is already at or above it cannot win (the stand-in
    # only adds per-tick seconds: :meth:`standin_bounds`), so its stand-in
    # is not compiled and timed; :attr:`bound_last` then says the last
    # prediction is that lower bound.
    self.standin_ceiling_s: float | None = None
    self.bound_last = False
    self.standins_skipped = 0
    # Uniform-span schedules not given a stand-in of their own
    # (``schedule_choice.choose``: estimated well slower).
    self.alt_standins_skipped = 0
    # Seconds per kernel call the last prediction's stand-in added (0: none).
    self.extra_last_s = 0.0

  @property
  def measured(self) -> bool:
    """Kernels are measured (``"measured"`` and ``"calibrated"``)."""
    return self.cost in ("measured", "calibrated")

  @property
  def calibrated(self) -> bool:
    """Each candidate program's per-tick cost is timed on its stand-in
    (``calibrate``): one more compile per candidate plan, so only asked
    for with ``cost="calibrated"``."""
    return self.cost == "calibrated"

  @property
  def _per_port(self) -> tuple[float, float] | None:
    """``(seconds per port, fixed port operations per tick)``, once final
    (``memo.per_port_s``)."""
    return self.memo.per_port_s

  # --- search graph ---------------------------------------------------------

  def link_model(self, mesh: Any, pipe_axis: str) -> _link.LinkModel:
    """The link model (measured once per CostModel when asked, cached;
    ``link_choice.link_model``)."""
    return _link_choice.link_model(self, mesh, pipe_axis)

  def search_graph(self, graph: BlockGraph, ks: Any, param_avals: Any,
                   mesh: Any, pipe_axis: str, part: Any = None,
                   stage: Any = None,
                   hoisted: frozenset[int] = frozenset(),
                   partial_bound: Any = None) -> SearchCosts:
    """Profiles ``ks`` (of partition ``part``) and quantises ``graph``
    (``search_costs``).

    With ``stage`` (``cost.stage.Stage``) every kernel is profiled on the
    devices of one stage, sharded over the GSPMD axes as the program runs
    it. In a multi-process run every process profiles its first device (or
    stage) and all use process 0's figures. ``hoisted``: block ids of the
    kernels the lowering runs with their parameter-only values computed
    before the ticks (``passes.hoist``), profiled so. ``partial_bound``:
    the caller's pruning check, also run on the kernels profiled so far
    before each further one (``search_costs.search_costs``).
    """
    return _search_costs.search_costs(self, graph, ks, param_avals, mesh,
                                      pipe_axis, part=part, stage=stage,
                                      hoisted=hoisted,
                                      partial_bound=partial_bound)

  # --- prediction -------------------------------------------------------------

  def _mesh_fields(self, mesh: Any, pipe_axis: str) -> dict[str, Any]:
    """What a per-tick measurement on ``mesh`` depends on (cache key;
    ``processes.mesh_fields``)."""
    return _processes.mesh_fields(mesh, pipe_axis)

  def tick_costs(self, mesh: Any, pipe_axis: str) -> _ticks.TickCosts:
    """Per-tick costs of the lowering on this mesh (microbenchmark, cached;
    measured once per CostModel)."""
    return _tick_pricing.tick_costs(self, mesh, pipe_axis)

  def _standin_seconds(self, plan: Any, mesh: Any, pipe_axis: str
                       ) -> float | None:
    """Step seconds of ``plan``'s stand-in program (memo, disk cache);
    None (logged) where it cannot be built or run."""
    return _standin.standin_seconds(self, plan, mesh, pipe_axis)

  def set_standin_seconds(self, plan: Any, mesh: Any, pipe_axis: str,
                          seconds: float) -> None:
    """Replaces the step seconds of ``plan``'s stand-in (memo and disk
    cache) with a figure timed again side by side with other plans'
    (``tessel_jax.choice_standins``)."""
    _standin.replace_seconds(self, plan, mesh, pipe_axis, seconds)

  def port_seconds(self, costs: SearchCosts, unrolled: Any, plan: Any,
                   mesh: Any, pipe_axis: str,
                   tick_costs: _ticks.TickCosts) -> tuple[float, float]:
    """``(seconds per port operation, fixed port operations per tick)`` of
    lowered programs on this machine (``cost.ports``): from the disk
    cache, else fitted on ``plan``'s stand-in program, its serial part
    (:meth:`serial_seconds`) taken off (one compile; a few per machine,
    ``cost.port_fit``) where :attr:`time_program` is set; 0 seconds where
    neither (screening builds, multi-process runs). See
    ``cost.port_pricing``."""
    if self.memo.per_port_s is not None:
      return self.memo.per_port_s
    got = _port_pricing.port_seconds(self, costs, unrolled, plan, mesh,
                                     pipe_axis, tick_costs)
    self.tally.add(got.spent_s or 0.0, hit=not got.measured)
    if got.final:
      self.memo.per_port_s = (got.per_port_s, got.tick_ports)
    return got.per_port_s, got.tick_ports

  def _replay(self, costs: SearchCosts, unrolled: Any,
              tick_model: _ticks.TickModel, idle: bool = False
              ) -> _predict.Prediction:
    """Replays ``unrolled`` with the measured kernels (``idle``: with
    zero-time kernels) and ``tick_model``'s costs."""
    return _tick_pricing.replay(costs, unrolled, tick_model, idle=idle)

  def predict(self, costs: SearchCosts, unrolled: Any, plan: Any,
              mesh: Any, pipe_axis: str
              ) -> tuple[_predict.Prediction, _ticks.TickModel]:
    """The measured prediction of a lowered schedule and its tick model.

    With :attr:`time_program` set, every kernel call also costs its share
    of what the plan's stand-in program pays beyond the microbenchmark's
    tick model (``calibrate.extra_tick_seconds``, spread over the calls:
    ``TickModel.plus_calls``). Not in a multi-process run: a
    cache hit on one host and a miss on another would run the stand-in's
    collectives on some processes only.
    """
    return _tick_pricing.predict(self, costs, unrolled, plan, mesh,
                                 pipe_axis)

  def _tick_model(self, costs: SearchCosts, unrolled: Any, plan: Any,
                  mesh: Any, pipe_axis: str) -> _ticks.TickModel:
    """The microbenchmark's tick model of ``plan`` (per-port seconds
    included unless ``cost="calibrated"``), before any stand-in."""
    return _tick_pricing.tick_model(self, costs, unrolled, plan, mesh,
                                    pipe_axis)

  def replay_like(self, costs: SearchCosts, unrolled: Any, plan: Any,
                  mesh: Any, pipe_axis: str, extra_s: float) -> float:
    """Seconds of ``unrolled`` lowered as ``plan``, its ticks priced by the
    tick model plus ``extra_s`` per kernel call (another plan's stand-in
    figure, ``extra_last_s``) without timing a stand-in of its own: a classic
    schedule priced on a searched plan's build (``plan_pricing``) then
    pays for its own ticks, rendezvous and held rounds."""
    return _tick_pricing.replay_like(self, costs, unrolled, plan, mesh,
                                     pipe_axis, extra_s)

  def standin_bounds(self, costs: SearchCosts, unrolled: Any, plan: Any,
                     mesh: Any, pipe_axis: str,
                     tick_model: _ticks.TickModel) -> bool:
    """Whether ``plan`` is priced without timing its stand-in program: a
    :attr:`standin_ceiling_s` is set, the stand-in is not known yet (memo
    or disk cache) and the replay with the microbenchmark's tick model
    alone is at or above the ceiling. That replay is a lower bound of the
    calibrated one: the stand-in adds what the program pays per tick
    beyond the toy tick (33-150 us against ~1.5 us on the model zoo), never
    less (``calibrate.extra_tick_seconds`` is not negative where the toy
    under-prices). README GPT, 4 devices, cold choice: most stand-ins
    timed were of plans that ended up slower than the choice.
    """
    return _standin.standin_bounds(self, costs, unrolled, plan, mesh,
                                   pipe_axis, tick_model)

  # --- serial part and report -------------------------------------------------

  def outside_seconds(self, layout: Any, mesh: Any, pipe_axis: str
                      ) -> float:
    """Seconds of the step's packing and unpacking around its ticks
    (``cost.outside``: measured once per program shape and machine,
    cached); 0 where the build gives no timer (screening builds,
    multi-process runs)."""
    return _serial.outside_seconds(self, layout, mesh, pipe_axis)

  def fsdp_link(self, costs: SearchCosts, layout: Any, mesh: Any,
                pipe_axis: str) -> _link.LinkModel:
    """The link pricing ``layout``'s FSDP collectives: measured over its
    data axes (``link.measure_gather_link``, cached per machine) in a
    measured single-process build with a timer, else the search's link
    model."""
    return _link_choice.fsdp_link(self, costs, layout, mesh, pipe_axis)

  def serial_seconds(self, costs: SearchCosts, plan: Any, layout: Any,
                     mesh: Any, pipe_axis: str) -> tuple[float, float]:
    """``(FSDP, outside)`` seconds of the step run serially with its
    ticks: the FSDP all-gathers and reduce-scatters of ``plan`` on
    ``layout`` (``passes.fsdp_comm``, priced by :meth:`fsdp_link`), and
    the packing and unpacking around the ticks (:meth:`outside_seconds`)."""
    return _serial.serial_seconds(self, costs, plan, layout, mesh,
                                  pipe_axis)

  def step_seconds(self, costs: SearchCosts, unrolled: Any, plan: Any,
                   layout: Any, mesh: Any, pipe_axis: str) -> float:
    """Predicted seconds of one step of ``plan`` (its replay plus
    :meth:`serial_seconds`): what plans are compared on and what
    :meth:`report` says."""
    pred, _ = self.predict(costs, unrolled, plan, mesh, pipe_axis)
    return pred.step_seconds + sum(self.serial_seconds(
        costs, plan, layout, mesh, pipe_axis))

  def report(self, costs: SearchCosts | None, unrolled: Any, plan: Any,
             layout: Any, unit: int, stash_limit_bytes: int | None,
             mesh: Any, pipe_axis: str, schedule_costs: str | None = None,
             alternative_ms: float | None = None) -> CostReport:
    """The build's :class:`CostReport` (resets the profiling counters).

    ``schedule_costs``: the spans the lowered schedule was searched on
    (``"measured"`` or ``"uniform"``, see ``api``); ``alternative_ms``: the
    predicted step time of the candidate not taken.
    """
    return _report_build.build_report(
        self, costs, unrolled, plan, layout, unit, stash_limit_bytes, mesh,
        pipe_axis, schedule_costs=schedule_costs,
        alternative_ms=alternative_ms)
