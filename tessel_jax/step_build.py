"""One build of a scheduled step: trace and cut (``step_cut``), kernels,
parameter layout and costs, the schedule (``step_schedule``; blocks
recompute their activations until one fits), the tick plan and the jitted
``shard_map`` program, gathered in a ``Built``.

Every function takes the ``ScheduledFunction`` (``step``) whose options it
reads.
"""

from __future__ import annotations

import dataclasses
import functools
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import jax

from tessel_jax import compat
from tessel_jax import fsdp_choice as _fsdp_choice
from tessel_jax import param_sharding as _param_sharding
from tessel_jax import placements as _placements
from tessel_jax import progress as _progress
from tessel_jax import ramps as _ramps
from tessel_jax import schedule_choice as _schedule_choice
from tessel_jax import step_cut
from tessel_jax import step_schedule
from tessel_jax.built import Built, block_modes
from tessel_jax.cost import calibrate as _calibrate
from tessel_jax.cost import outside as _outside
from tessel_jax.cost import price_ahead as _price_ahead
from tessel_jax.cost import stage as _stage
from tessel_jax.graph import BlockGraph
from tessel_jax.hand_placement import forward_reach

try:  # installed: passes/ is tessel_jax.passes
  from tessel_jax.passes import hoist as _hoist  # type: ignore
  from tessel_jax.passes import kernels as _kernels  # type: ignore
  from tessel_jax.passes import lower as _lower  # type: ignore
  from tessel_jax.passes import packing as _packing  # type: ignore
  from tessel_jax.passes import plan as _plan  # type: ignore
  from tessel_jax.passes import shared_aux as _shared_aux  # type: ignore
  from tessel_jax.passes import tick_order as _tick_order  # type: ignore
except ImportError:  # run from the repository root
  from passes import hoist as _hoist  # type: ignore
  from passes import kernels as _kernels  # type: ignore
  from passes import lower as _lower  # type: ignore
  from passes import packing as _packing  # type: ignore
  from passes import plan as _plan  # type: ignore
  from passes import shared_aux as _shared_aux  # type: ignore
  from passes import tick_order as _tick_order  # type: ignore


def build(step: Any, params: Any, batch: Any,
          shards: Mapping[int, int] | None = None, axes: Any = None) -> Built:
  """Traces, cuts, searches and lowers ``step.fn`` for these inputs.

  ``shards``: parameter leaf -> dimension sharded over the pipe axis;
  ``axes``: ``step._axes(params)`` (computed when None).
  """
  shards = dict(shards or {})
  t0 = time.perf_counter()
  clock = _progress.Clock(step.fn_name)
  data_axes, _, specs = axes if axes is not None else step._axes(params)  # pylint: disable=protected-access
  num_devices, n_total, n_local = step_cut.counts(step, data_axes)
  train = step.mode == "train"
  # Leaves sharded by the user are stored whole (a scanned stack is not
  # cut into per-block slices), so their specs keep naming the same leaves.
  split_leaves = not (shards or specs)
  traced, rows, graph, part, forward_of, local_parts = shared(
      step, ("cut", num_devices, n_total, train, split_leaves),
      lambda: _cut(step, params, batch, n_total, num_devices, train,
                   split_leaves, clock))
  mesh_shape = dict(step.mesh.shape)
  (ks, layout, costs, sgraph, unit, schedule, unrolled,
   hoisted) = search_kernels(
      step, graph, part, traced, local_parts, forward_of, shards, rows,
      n_total, n_local, num_devices, train, clock,
      split={l: (spec, spec_parts(spec, mesh_shape))
             for l, spec in specs.items()},
      data_sizes={a: int(mesh_shape[a]) for a in data_axes})
  if step.has_aux:
    _shared_aux.check(part, ks, local_parts)
  ramps = _ramps.resolve(step.interpret_ramps, platform(step))
  make_plan = functools.partial(_make_plan, step, ks, n_local, num_devices,
                                layout, shards, ramps.value)
  make_program = functools.partial(_program_of, step, part, layout,
                                   data_axes, train, n_total, traced)
  _install_timers(step, costs, make_program, params, batch, data_axes,
                  traced, train)
  # The first price's programs (cost.ticks, cost.outside) compile on the
  # background thread while the candidates are searched and planned.
  ahead = (_price_ahead.start(step._costs, layout, step.mesh,  # pylint: disable=protected-access
                              step.pipe_axis)
           if _compares(step, costs) else [])
  try:
    plan, choice, picked = _choose_plan(
        step, costs, graph, ks, unit, layout, n_local, unrolled, make_plan,
        clock, hoisted)
    if picked is not None:
      sgraph, schedule, unrolled = picked
    lowering, jitted = _lower_program(step, plan, part, layout, data_axes,
                                      train, n_total, traced)
    report = _report(step, costs, unrolled, plan, layout, unit, ks, choice,
                     _ramps.with_fsdp(
                         ramps.note, layout,
                         _fsdp_choice.why(step, layout, plan)), hoisted)
    report = _with_hoisted(report, lowering, traced, costs)
    step.replay_run = (None if costs is None else _run_replay(
        step, costs, make_plan, step._costs.extra_last_s))  # pylint: disable=protected-access
  finally:
    _price_ahead.finish(ahead)
    _release_timers(step)
  clock.lap("lower", f"plan {plan.loop_summary()}")
  clock.total("built (compiles at the first call)")
  return Built(graph=sgraph, schedule=schedule, unrolled=unrolled, plan=plan,
               partition=part, kernels=ks, layout=layout, memory_unit=unit,
               jitted=jitted, build_seconds=time.perf_counter() - t0,
               report=report,
               profile=costs.profile if costs is not None else None,
               lowering=lowering)


def _install_timers(step: Any, costs: Any, make_program: Any, params: Any,
                    batch: Any, data_axes: Any, traced: Any,
                    train: bool) -> None:
  """Sets the program timers a measured prediction uses on ``step._costs``
  (and ``step.standin_program``), or None where the build times nothing.

  Args:
    step: The ScheduledFunction being built.
    costs: The build's measured costs (None: not measured).
    make_program: ``plan -> program`` of this build (``_program_of``).
    params: The parameters the timers run the programs on.
    batch: The batch the timers run the programs on.
    data_axes: The mesh's data-parallel axes.
    traced: The traced function.
    train: Whether the step is a training step.
  """
  # Measured predictions may time a plan's program (not in a screening
  # build, tessel_jax.plans): "calibrated" each plan's stand-in, "measured"
  # the first plan on a machine for its per-port cost (cost.ports).
  screened = (getattr(step, "screening", False) or
              getattr(step, "cheap_screening", False))
  calibrate = (costs is not None and not screened and
               step._costs.measured)  # pylint: disable=protected-access
  # The build's close candidates are timed again side by side during the
  # choice (cost="calibrated": tessel_jax.choice_standins); placement="auto"
  # times the close leaders' stand-ins again after the builds
  # (tessel_jax.paired_standins). Both take the compiled stand-ins kept.
  keep = calibrate and getattr(step, "keep_standins", False)
  pair = calibrate and step._costs.calibrated  # pylint: disable=protected-access
  if keep or pair:
    make_program.compiled = {}  # filled by calibrate.program_timer
  step.standin_program = make_program if keep else None
  step.choice_standins = make_program if pair else None
  step._costs.time_program = (  # pylint: disable=protected-access
      _calibrate.program_timer(make_program, params, batch)
      if calibrate else None)
  step._costs.time_outside = (  # pylint: disable=protected-access
      _outside.layout_timer(step.mesh, step.pipe_axis, data_axes, traced,
                            params) if calibrate and train else None)


def _release_timers(step: Any) -> None:
  """Drops the timers :func:`_install_timers` set: they hold the traced
  program, never kept past the build."""
  step._costs.time_program = None  # pylint: disable=protected-access
  step._costs.time_outside = None  # pylint: disable=protected-access
  programs = getattr(step, "choice_standins", None)
  if programs is not None and getattr(step, "standin_program",
                                      None) is None:
    programs.compiled.clear()  # (else kept for paired_standins.recheck)
  step.choice_standins = None


@dataclasses.dataclass(frozen=True)
class RunReplay:
  """``(unrolled, plan=None) -> seconds``: another schedule of one build's
  kernels, lowered (``plan``, else its own tick plan) and replayed with the
  build's measured kernels and tick model, plus ``extra_s`` per kernel
  call (what the build's stand-in added; ``CostModel.replay_like``).
  ``plan_pricing.baseline_price`` prices the classic schedules with it."""

  model: Any
  costs: Any
  make_plan: Callable[[Any], Any]
  mesh: Any
  pipe_axis: str
  extra_s: float = 0.0

  def __call__(self, unrolled: Any, plan: Any = None) -> float:
    if plan is None:
      plan = self.make_plan(unrolled.actions)
    return self.model.replay_like(self.costs, unrolled, plan, self.mesh,
                                  self.pipe_axis, self.extra_s)


def _run_replay(step: Any, costs: Any, make_plan: Callable[[Any], Any],
                extra_s: float) -> RunReplay:
  """The :class:`RunReplay` of a build of ``step``."""
  return RunReplay(step._costs, costs, make_plan, step.mesh,  # pylint: disable=protected-access
                   step.pipe_axis, extra_s)


def platform(step: Any) -> str:
  """The platform of ``step``'s mesh (``"cpu"``, ``"gpu"``, ``"tpu"``):
  the lowering's default form (``tessel_jax.ramps``) follows it."""
  return str(step.mesh.devices.flat[0].platform)


def shared(step: Any, key: tuple, make: Callable[[], Any]) -> Any:
  """``make()``, or what it gave for ``key`` in an earlier build sharing
  ``step.shared_front`` (``tessel_jax.plans`` gives one dict to every build
  of one placement, width and N: the screening build, the full one and
  those under a memory limit trace, cut and build the same kernels)."""
  memo = getattr(step, "shared_front", None)
  if memo is None:
    return make()
  if key not in memo:
    memo[key] = make()
  return memo[key]


def _cut(step: Any, params: Any, batch: Any, n_total: int, num_devices: int,
         train: bool, split_leaves: bool, clock: Any) -> tuple:
  """``(traced, rows, graph, part, forward_of, local_parts)``: ``step.fn``
  traced on one micro-batch and cut into the placement's blocks."""
  traced, rows, microbatch, p_avals = step_cut.trace(step, params, batch,
                                                     n_total)
  clock.lap("trace")
  graph, part, traced = step_cut.partition_graph(
      step, traced, num_devices, train, split_leaves=split_leaves)
  forward_of = {b.id: _placements.forward_index(b) for b in graph.blocks}
  local_parts = step_cut.local_parts(
      step, graph, rows, microbatch, p_avals, part, traced,
      forward_reach(graph, forward_of), num_devices)
  clock.lap("cut", f"{len(part.blocks)} forward blocks")
  return traced, rows, graph, part, forward_of, local_parts


def _make_plan(step: Any, ks: Any, n_local: int, num_devices: int,
               layout: Any, shards: Mapping[int, int],
               interpret_ramps: int | None, actions: Any) -> Any:
  """The tick plan of ``actions`` (``passes.plan.build_plan``);
  ``interpret_ramps`` resolved (``tessel_jax.ramps``)."""
  actions = _tick_order.apply(ks.kernels, actions, step.switches.tick_order)
  return _plan.build_plan(ks, actions, n_local, num_devices, layout,
                          max_period=step.max_loop_period,
                          interpret_ramps=interpret_ramps,
                          collective=frozenset(
                              kid for kid, k in ks.kernels.items()
                              if len(k.devices) == num_devices and
                              any(l in shards for l in k.params)))


def _choose_plan(step: Any, costs: Any, graph: BlockGraph, ks: Any,
                 unit: int, layout: Any, n_local: int, unrolled: Any,
                 make_plan: Any, clock: Any, hoisted: int = 0
                 ) -> tuple[Any, Any, Any]:
  """``(plan, choice, picked)``: with measured costs and a searched
  schedule, the candidates of ``step_schedule.candidates`` priced against
  the one searched on the measured spans (``schedule_choice.choose``;
  ``choice``: None when none was found or nothing is priced) and the
  cheapest lowered; ``picked``: its ``(graph, schedule, unrolled)``, None
  when it is the first."""
  plan = make_plan(unrolled.actions)
  if not _compares(step, costs):
    return plan, None, None
  # The first price of a process also measures the lowering's per-tick
  # and packing costs on this machine (cost.ticks, cost.outside; cached).
  choice = _schedule_choice.choose(
      step, costs, unrolled, plan,
      step_schedule.candidates(step, graph, ks, unit, layout, n_local,
                               costs, hoisted), make_plan, clock)
  if choice is None:
    return plan, None, None
  chosen = choice.chosen
  return chosen.plan, choice, chosen.found


def _compares(step: Any, costs: Any) -> bool:
  """Whether the build prices candidate schedules (:func:`_choose_plan`):
  measured costs and a searched schedule, not a screening build
  (``tessel_jax.plans``, ``placement="auto"``: it prices only the schedule
  searched on measured spans)."""
  return (costs is not None and step.plan is None and
          not getattr(step, "screening", False))


def _program_of(step: Any, part: Any, layout: Any, data_axes: Sequence[str],
                train: bool, n_total: int, traced: Any, plan: Any) -> Any:
  """The lowered (unjitted) program of tick plan ``plan``: what
  ``tessel_jax.cost.calibrate`` times with its kernels stood in for."""
  prog = _lower.Lowering(plan, part, layout, compat.auto_mesh(step.mesh),
                         step.pipe_axis, data_axes, train, n_total,
                         step.switches).program()
  return (prog if traced.leaf_split is None else
          traced.leaf_split.wrap(prog, train))


def _lower_program(step: Any, plan: Any, part: Any, layout: Any,
                   data_axes: Sequence[str], train: bool, n_total: int,
                   traced: Any) -> tuple[Any, Any]:
  """``(passes.lower.Lowering, jitted program)`` of ``plan``."""
  lowering = _lower.Lowering(plan, part, layout,
                             compat.auto_mesh(step.mesh), step.pipe_axis,
                             data_axes, train, n_total, step.switches)
  program = lowering.program()
  out_shardings = (lowering.out_shardings(step.mesh)
                   if compat.has_explicit_axes(step.mesh) else None)
  if traced.leaf_split is not None:  # stacked leaves stored as slices
    program = traced.leaf_split.wrap(program, train)
    out_shardings = None  # the wrapper re-stacks the sliced gradients
  if out_shardings is not None:
    program = _typed_on(program, out_shardings)
  return lowering, jax.jit(program, out_shardings=out_shardings)


def _typed_on(program: Any, out_shardings: Any) -> Any:
  """``program`` with its outputs resharded to ``out_shardings`` (the
  user's mesh with its Explicit axes): the shard_map runs on an Auto copy
  of the mesh, and inside a caller's ``jax.jit`` its outputs were typed on
  that copy, so an optimizer update mixing them with values typed on the
  user's mesh (a training loop's second step) failed with JAX's "Mesh for
  all inputs should be equal"."""

  def typed(*args: Any) -> Any:
    return jax.sharding.reshard(program(*args), out_shardings)

  return typed


def _report(step: Any, costs: Any, unrolled: Any, plan: Any, layout: Any,
            unit: int, ks: Any, choice: Any, lowering: str = "",
            hoisted: int = 0) -> Any:
  """The build's ``CostReport`` (None when the cost model gives none);
  ``choice``: the ``schedule_choice.Choice`` made (None: none)."""
  model = step._costs  # pylint: disable=protected-access
  report = model.report(
      costs, unrolled, plan, layout, unit,
      step_schedule.memory_limit_bytes(step, layout, costs, hoisted),
      step.mesh, step.pipe_axis,
      schedule_costs=None if choice is None else choice.taken,
      alternative_ms=None if choice is None else choice.alternative_ms)
  if report is not None:
    report = dataclasses.replace(
        report, block_modes=block_modes(ks), lowering=lowering,
        candidate_ms={} if choice is None else choice.candidate_ms)
  return report


def _with_hoisted(report: Any, lowering: Any, traced: Any,
                  costs: Any = None) -> Any:
  """``report`` with the kernels' hoisted parameter-only values
  (``passes.hoist``, live for the whole step) in its peak bytes; kernels
  with equal profile keys (``costs.profile``) share their traces."""
  if report is None:
    return None
  plan = lowering.plan
  nbytes = _hoist.predicted_bytes(plan.kernels, lowering.layout,
                                  traced.param_avals, plan.num_microbatches,
                                  inplace=lowering.inplace_params,
                                  hoist=lowering.switches.hoist,
                                  keys=_profile_keys(costs))
  return dataclasses.replace(
      report, hoisted_bytes=nbytes,
      peak_memory_bytes=tuple(b + nbytes for b in report.peak_memory_bytes))


def _profile_keys(costs: Any) -> dict[int, str] | None:
  """Kernel id -> its profile's cache key (None without a profile)."""
  profile = getattr(costs, "profile", None)
  if profile is None:
    return None
  return {bid: k.key for bid, k in profile.kernels.items()}


def hoisted_limit_bytes(step: Any, ks: Any, layout: Any, traced: Any,
                        n_local: int, costs: Any = None) -> int:
  """Bytes per device of the kernels' hoisted parameter-only values
  (``passes.hoist``), held against the memory limit when there is one
  (0 without a limit: then they are only reported)."""
  if step_schedule.memory_limit_bytes(step, layout) is None:
    return 0
  return _hoist.predicted_bytes(ks.kernels, layout, traced.param_avals,
                                n_local, hoist=step.switches.hoist,
                                keys=_profile_keys(costs))


def search_kernels(step: Any, graph: BlockGraph, part: Any, traced: Any,
                   local_parts: Any, forward_of: Any,
                   shards: Mapping[int, int], rows: int, n_total: int,
                   n_local: int, num_devices: int, train: bool, clock: Any,
                   split: Mapping[int, Any] | None = None,
                   data_sizes: Mapping[str, int] | None = None) -> tuple:
  """Kernels, layout, costs and the searched schedule; blocks recompute
  their activations (the one stashing most first) until one fits.
  ``split``: leaf -> (spec, pieces) of leaves sharded over GSPMD or data
  axes; ``data_sizes``: data axis -> devices (leaves split over one are
  FSDP).

  Returns ``(kernels, layout, costs, search graph, memory unit, schedule,
  unrolled, hoisted bytes)``; the last is :func:`hoisted_limit_bytes` of
  the kernels found on the layout chosen, predicted once per layout tried.
  """
  seeds = _kernels.loss_seeds(part, n_total) if train else None
  keep = step_schedule.initial_keep(step, len(part.blocks))
  while True:
    ks = shared(step, ("kernels", id(part), tuple(sorted(keep.items()))),
                lambda keep=dict(keep): _kernels.build_kernels(
                    part, graph, train=train, microbatch_rows=rows,
                    keep=keep, seeds=seeds, forward_of=forward_of,
                    local_parts=local_parts,
                    trim=step.switches.residual_trim,
                    row_dots=step.switches.row_dots,
                    row_dots_forward=step.switches.row_dots_forward,
                    conv_forms=step_cut.conv_forms(step),
                    shared_w=step.switches.shared_w))
    layout = _layout(step, ks, traced, shards, num_devices, split,
                     data_sizes)
    clock.lap("kernels", f"{len(ks.kernels)} kernels")
    costs, sgraph, unit = _search_graph(step, graph, ks, traced, part,
                                        layout, data_sizes, n_local, clock)
    try:
      searches = step.searches
      layout, (schedule, unrolled, hoisted) = _fsdp_choice.first_fitting(
          _fsdp_choice.layouts(step.fsdp, layout),  # fsdp="auto"
          functools.partial(_find_schedule, step, ks, traced, sgraph, unit,
                            n_local, costs))
      clock.lap("search", step_schedule.search_note(
          schedule, unrolled, step.searches > searches))
      return ks, layout, costs, sgraph, unit, schedule, unrolled, hoisted
    except step_schedule.InfeasibleMemory as err:
      _recompute_more(step, ks, keep, err)


def _find_schedule(step: Any, ks: Any, traced: Any, sgraph: BlockGraph,
                   unit: int, n_local: int, costs: Any, layout: Any
                   ) -> tuple[tuple[Any, Any, int], bool]:
  """``((schedule, unrolled, hoisted bytes), fits)`` on ``layout``
  (``fits``: within the memory limit, ``fsdp_choice.fits``); the limit
  counts the hoisted bytes (:func:`hoisted_limit_bytes`).

  Raises:
    step_schedule.InfeasibleMemory: no schedule fits the memory limit.
  """
  hoisted = hoisted_limit_bytes(step, ks, layout, traced, n_local, costs)
  schedule, unrolled = step_schedule.find_schedule(
      step, sgraph, unit, layout, n_local, costs, hoisted)
  fits = _fsdp_choice.fits(step, layout, unit, unrolled, costs, hoisted)
  return (schedule, unrolled, hoisted), fits


def _recompute_more(step: Any, ks: Any, keep: dict[int, bool],
                    err: Exception) -> None:
  """Marks the kept block stashing the most for recomputation, or raises
  ``err`` (as the step's error) when none is left or ``recompute`` is set."""
  candidates = [i for i, k in keep.items() if k]
  if not candidates or step.recompute is not None:
    note = (" (every block already recomputes its activations)"
            if not candidates else "")
    raise step._error(f"{err}{note}") from None  # pylint: disable=protected-access
  worst = max(candidates, key=lambda i: ks.kernels[
      ks.forward_ids[i]].stash_bytes)
  keep[worst] = False


def _layout(step: Any, ks: Any, traced: Any, shards: Mapping[int, int],
            num_devices: int, split: Mapping[int, Any] | None,
            data_sizes: Mapping[str, int] | None) -> Any:
  """The parameter layout of kernels ``ks`` (``passes.packing``)."""
  gathered = _param_sharding.subset_readers(shards, ks, num_devices)
  return _packing.make_layout(
      traced.param_avals,
      {i: _param_sharding.stored_params(ks.kernels[ks.forward_ids[i]],
                                        gathered, num_devices)
       for i in ks.forward_ids},
      {i: ks.kernels[ks.forward_ids[i]].devices for i in ks.forward_ids},
      num_devices, mode=step.param_layout,
      shards={l: (ax, num_devices) for l, ax in shards.items()},
      split=split, gathered=gathered, data_sizes=data_sizes,
      fsdp_mode="per_block" if step.fsdp == "per_block" else "per_step")


def _search_graph(step: Any, graph: BlockGraph, ks: Any, traced: Any,
                  part: Any, layout: Any,
                  data_sizes: Mapping[str, int] | None, n_local: int,
                  clock: Any) -> tuple[Any, BlockGraph, int]:
  """``(costs or None, search graph, memory unit)``: measured spans,
  memory and delays, or uniform spans with ``cost="uniform"``."""
  model = step._costs  # pylint: disable=protected-access
  if not model.measured:
    return (None,) + step_schedule.uniform_graph(graph, ks)
  stage = _stage.stage_of(step.mesh, step.pipe_axis,
                          tuple(data_sizes or ()), layout)
  hoisted = frozenset(
      b for b, k in ks.kernels.items()
      if step.switches.hoist and _hoist.hoistable(layout, n_local, k))
  bound = getattr(step, "price_bound", None)  # tessel_jax.plans pruning
  partial = (None if bound is None else
             lambda known: bound(known, n_local))  # checked between kernels
  costs = model.search_graph(graph, ks, traced.param_avals, step.mesh,
                             step.pipe_axis, part, stage=stage,
                             hoisted=hoisted, partial_bound=partial)
  clock.lap("profile")
  if bound is not None:
    bound(costs, n_local)
  return costs, costs.graph, costs.memory_unit


def spec_parts(spec: Sequence[Any], shape: Mapping[str, int]) -> int:
  """How many pieces a ``PartitionSpec``'s entries cut a leaf into."""
  parts = 1
  for e in spec:
    for a in (e if isinstance(e, (tuple, list)) else (e,) if e else ()):
      parts *= int(shape[a])
  return parts
