"""``tessel_jax.schedule``: a step function + mesh + placement -> one program.

::

    step = tj.schedule(loss_fn, mesh=mesh, placement=tj.placements.mshape(4),
                       num_microbatches=8)
    loss, grads = step(params, batch)        # == jax.value_and_grad of the
                                             #    mean over micro-batches
    step.schedule                            # the searched Schedule
    step.lower(params, batch).compile()      # like jax.jit

On the first call for given input shapes the function is traced and cut at
its ``tj.boundary`` markers (``passes.partition``), the backward is derived
(``passes.kernels``), every kernel is compiled alone and timed on the mesh's
first device (``tessel_jax.cost``; cached on disk), the measured seconds,
stash bytes and communication become the search's integer spans, memory
units and edge delays, the schedule is searched with CP-SAT, and lowered to
one ``jax.jit(jax.shard_map(...))`` program (``passes.plan``,
``passes.lower``). ``cost="uniform"`` (or ``TESSEL_JAX_COST=uniform`` in the
environment) skips the measurement and uses spans F=1, B=2, W=1.
``step.report`` gives the predicted step time, per-device peak memory and
bubble ratio in milliseconds and bytes.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import os
import time
import warnings
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import jax
import numpy as np

from tessel_jax import checks as _checks
from tessel_jax import compat
from tessel_jax import param_sharding as _param_sharding
from tessel_jax import placed_step as _placed_step
from tessel_jax import placements as _placements
from tessel_jax import progress as _progress
from tessel_jax import schedule_cache as _schedule_cache
from tessel_jax.cost import calibrate as _calibrate
from tessel_jax.cost import model as _cost_model
from tessel_jax.cost import stage as _stage
from tessel_jax.graph import BlockGraph, PlacementError
from tessel_jax.hand_placement import (SPANS, Placement, fitting_placements,
                                       forward_count, forward_only,
                                       forward_reach)
from tessel_jax.schedule import Schedule, UnrolledSchedule

try:  # installed: passes/ is tessel_jax.passes
  from tessel_jax.passes import align as _align  # type: ignore
  from tessel_jax.passes import autocut as _autocut  # type: ignore
  from tessel_jax.passes import boundary as _boundary  # type: ignore
  from tessel_jax.passes import errors as _errors  # type: ignore
  from tessel_jax.passes import kernels as _kernels  # type: ignore
  from tessel_jax.passes import lower as _lower  # type: ignore
  from tessel_jax.passes import packing as _packing  # type: ignore
  from tessel_jax.passes import partition as _partition  # type: ignore
  from tessel_jax.passes import plan as _plan  # type: ignore
  from tessel_jax.passes import shared_aux as _shared_aux  # type: ignore
except ImportError:  # run from the repository root
  from passes import align as _align  # type: ignore
  from passes import autocut as _autocut  # type: ignore
  from passes import boundary as _boundary  # type: ignore
  from passes import errors as _errors  # type: ignore
  from passes import kernels as _kernels  # type: ignore
  from passes import lower as _lower  # type: ignore
  from passes import packing as _packing  # type: ignore
  from passes import partition as _partition  # type: ignore
  from passes import plan as _plan  # type: ignore
  from passes import shared_aux as _shared_aux  # type: ignore

TesselError = _errors.TesselError
boundary = _boundary.boundary

MODES = ("train", "infer")
MEMORY_UNITS = 16  # the largest block's stash is this many memory units
COST_ENV = "TESSEL_JAX_COST"  # default of ``cost=`` when it is not given


@dataclasses.dataclass(frozen=True, eq=False)
class Built:
  """Everything made for one set of input shapes.

  Attributes:
    graph: The placement graph searched (spans and memory units filled in).
    schedule: The searched Schedule (None for baselines / given schedules).
    unrolled: The schedule for this step's micro-batches (one data replica).
    plan: Tick plan.
    partition: The partition.
    kernels: Kernels.
    layout: Parameter layout.
    memory_unit: Bytes per memory unit of ``graph``.
    jitted: The jitted program.
    build_seconds: Python time spent building (search included).
    report: Predicted step time, peak memory, bubbles and profiling figures
      (``tessel_jax.cost.report.CostReport``).
    profile: The kernel measurements (None with ``cost="uniform"``).
    lowering: The ``passes.lower.Lowering`` (its ``smap`` runs already-placed
      parameters, ``tessel_jax.placed``).
  """

  graph: BlockGraph
  schedule: Schedule | None
  unrolled: UnrolledSchedule
  plan: Any
  partition: Any
  kernels: Any
  layout: Any
  memory_unit: int
  jitted: Callable[..., Any]
  build_seconds: float
  report: Any = None
  profile: Any = None
  lowering: Any = None

  def predicted_stash_bytes(self) -> tuple[int, ...]:
    """Peak stashed bytes per device from the schedule (memory units)."""
    return tuple(p * self.memory_unit for p in self.unrolled.peak_memory)


def _shared_modes(ks: Any) -> list[tuple[str, Any]]:
  """``(F label, BlockMode)`` of every forward block on several devices."""
  modes = getattr(ks, "modes", None) or {}
  return [(f"F{i}", m) for i, m in sorted(modes.items())
          if len(m.devices) > 1]


def block_modes(ks: Any) -> dict[str, str]:
  """``{"F0": "split 4-way" | "replicated: <reason>"}`` for ``step.report``."""
  return {label: m.describe() for label, m in _shared_modes(ks)}


def _fn_name(fn: Callable[..., Any]) -> str:
  return getattr(fn, "__name__", None) or type(fn).__name__


class ScheduledFunction:
  """The function returned by :func:`schedule`.

  Calling it runs the pipelined program (training: ``(loss, grads)``, or
  ``((loss, aux), grads)`` with ``has_aux``; inference: the outputs, or
  ``(outputs, aux)``); ``lower`` returns ``jax.stages.Lowered`` like
  ``jax.jit(f).lower``; ``schedule``, ``unrolled`` and ``built`` describe
  the last build.
  """

  def __init__(self, fn: Callable[..., Any], *, mesh: Any, placement: Any,
               num_microbatches: int, mode: str, memory_limit: int | None,
               pipe_axis: str, solver_time_limit_s: float, plan: Any,
               recompute: Any, seed: int, max_loop_period: int,
               param_layout: str, interpret_ramps: int | None,
               param_sharding: Any = None, cost: str | None = None,
               time_resolution: float | None = None,
               reprofile: bool = False, link: Any = None,
               cache_dir: str | None = None, optimizer_slots: int = 0,
               cut: str | None = None, has_aux: bool = False,
               verbose: bool = False, data_axes: Any = None):
    self.fn = fn
    self.data_axes = data_axes
    self.auto = isinstance(placement, str) and placement == "auto"
    self.choice: Any = None  # tessel_jax.plans.AutoChoice of the last build
    self.has_aux = has_aux
    self.fn_name = _fn_name(fn)
    self.mesh = mesh
    self.placement = placement
    self.num_microbatches = num_microbatches
    self.mode = mode
    self.memory_limit = memory_limit
    self.pipe_axis = pipe_axis
    self.solver_time_limit_s = solver_time_limit_s
    self.plan = plan
    self.recompute = recompute
    self.seed = seed
    self.max_loop_period = max_loop_period
    self.param_layout = param_layout
    self.interpret_ramps = interpret_ramps
    self.param_sharding = param_sharding
    self.cut = cut
    self.cost = cost if cost is not None else os.environ.get(COST_ENV,
                                                             "measured")
    self.time_resolution = time_resolution
    self.reprofile = reprofile
    self.link = link
    self.cache_dir = cache_dir
    self.optimizer_slots = optimizer_slots
    self._costs: Any = None  # tessel_jax.cost.model.CostModel
    self._cache: dict[Any, Built] = {}
    self._choices: dict[Any, Any] = {}  # placement="auto": key -> AutoChoice
    self._last: Built | None = None
    self._ran: set[int] = set()  # ids of Builts whose program has run
    self._warned: set[Any] = set()  # data_axes warnings already shown
    self.searches = 0  # CP-SAT searches run (schedule cache misses)
    self.schedule_cache_hits = 0
    self.verbose = bool(verbose)
    if self.verbose:
      _progress.enable()
    functools.update_wrapper(self, fn)
    self._check_static()

  # --- public ---------------------------------------------------------------

  def __call__(self, params: Any, batch: Any) -> Any:
    if isinstance(params, _placed_step.Placed):
      return _placed_step.call(self, params, batch)
    built = self.build(params, batch)
    if id(built) in self._ran:
      return built.jitted(params, batch)
    clock = _progress.Clock(self.fn_name)
    with _progress.CompileTimes() as times:
      out = built.jitted(params, batch)
    self._ran.add(id(built))
    clock.lap("compile", times.note())
    return out

  def verify(self, params: Any, batch: Any, *, rtol: float = 1e-5,
             microbatches: int | None = None) -> Any:
    """Compares the program with ``jax.value_and_grad`` (infer: the plain
    outputs) on these inputs; a ``tessel_jax.verify.VerifyReport`` (max error
    per leaf, the first block that differs). See ``tessel_jax.verify``."""
    from tessel_jax import verify as _verify  # pylint: disable=import-outside-toplevel
    return _verify.verify(self, params, batch, rtol=rtol,
                          microbatches=microbatches)

  def lower(self, params: Any, batch: Any) -> Any:
    """``jax.jit(...).lower(params, batch)`` of the pipelined program
    (``params`` may be placed)."""
    if isinstance(params, _placed_step.Placed):
      return _placed_step.lower(self, params, batch)
    return self.build(params, batch).jitted.lower(params, batch)

  def place(self, params: Any, batch: Any = None) -> Any:
    """``params`` packed once into the per-device layout: a
    ``tessel_jax.placed.Placed`` pytree, already sharded on the mesh.
    ``step(placed, batch)`` then runs without packing and (training)
    returns the gradients placed the same way; ``step.unplace`` gives the
    user's tree back. Without ``batch``: for the last build."""
    return _placed_step.place(self, params, batch)

  def unplace(self, placed: Any) -> Any:
    """The user's parameter tree from placed parameters (or gradients)."""
    return _placed_step.unplace(self, placed)

  def train_step(self, optimizer: Any) -> Callable[..., Any]:
    """``f(placed, opt_state, batch) -> (value, placed, opt_state)``: the
    step and an optax update in one program donating ``placed`` and
    ``opt_state`` (``opt_state = optimizer.init(placed)``)."""
    return _placed_step.train_step(self, optimizer)

  @property
  def built(self) -> Built:
    if self._last is None:
      raise self._error("nothing is built yet; call the step (or"
                        " step.lower(params, batch)) once first, the schedule"
                        " depends on the input shapes")
    return self._last

  @property
  def schedule(self) -> Schedule | None:
    """The searched Schedule (None when a baseline/given schedule is used)."""
    return self.built.schedule

  @property
  def unrolled(self) -> UnrolledSchedule:
    """The timed schedule of one step (per data-parallel replica)."""
    return self.built.unrolled

  def grid(self, max_steps: int | None = 64) -> str:
    """The schedule's text grid; a legend below it says how every block on
    several devices shares a micro-batch (split or replicated, and why)."""
    text = self.built.unrolled.grid(max_steps=max_steps)
    ks = self.built.kernels
    legend = [f"F{ks.forward_ids[m.index]} (forward block {m.index}) on"
              f" devices {list(m.devices)}: {m.describe()}"
              for _, m in _shared_modes(ks)]
    return text + ("\n" + "\n".join(legend) if legend else "")

  @property
  def report(self) -> Any:
    """``CostReport`` of the last build: predicted step time (ms), per-device
    peak memory (bytes), bubble ratio, quantisation error, profiling time."""
    return self.built.report

  # --- building -------------------------------------------------------------

  def _error(self, problem: str) -> TesselError:
    return _errors.fail(self.fn_name, problem)

  def _check_static(self) -> None:
    if self.mode not in MODES:
      raise self._error(f"mode is {self.mode!r}; use 'train' (loss and"
                        f" gradients) or 'infer' (outputs)")
    names = tuple(getattr(self.mesh, "axis_names", ()))
    if self.pipe_axis not in names:
      raise self._error(
          f"the mesh has axes {names} but no {self.pipe_axis!r} axis to run"
          f" the pipeline on; make the mesh with one, e.g. jax.make_mesh((4,),"
          f" ({self.pipe_axis!r},)), or pass pipe_axis= naming the axis to"
          f" use")
    if self.auto and self.plan is not None:
      raise self._error("placement='auto' chooses the schedule too; drop"
                        " plan=, or name a placement to lower that plan")
    self._check_numbers()
    if not isinstance(self.has_aux, bool):
      raise self._error(f"has_aux must be True or False, got"
                        f" {self.has_aux!r}")
    if self.cut not in _autocut.CUT_MODES:
      raise self._error(f"cut={self.cut!r}; use 'auto' (cut by cost, ignoring"
                        f" any tj.boundary), 'markers' (cut at the"
                        f" tj.boundary calls) or None (markers when there are"
                        f" any, else auto)")
    try:
      self._costs = _cost_model.CostModel(
          cost=self.cost, time_resolution=self.time_resolution,
          reprofile=self.reprofile, link=self.link, cache_dir=self.cache_dir,
          optimizer_slots=self.optimizer_slots)
    except ValueError as err:
      raise self._error(str(err)) from None

  def _check_numbers(self) -> None:
    """Type and range checks of the numeric options (``checks``)."""
    n = self.num_microbatches
    if n is None and self.auto:
      n = 1  # placement="auto" tries the counts that divide the batch
    if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n < 1:
      raise self._error(f"num_microbatches must be an integer >= 1, got {n!r}"
                        + (" (or None with placement='auto')"
                           if not self.auto else ""))
    try:
      _checks.microbatches(n)
      if self.memory_limit is not None:
        _checks.integer(self.memory_limit, "memory_limit", low=0,
                        high=2**62, fix="give bytes per device, or None for"
                        " what the device reports")
      _checks.time_limit(self.solver_time_limit_s, "solver_time_limit_s")
      _checks.integer(self.seed, "seed", low=0, high=2**31 - 1)
      _checks.integer(self.optimizer_slots, "optimizer_slots", low=0,
                      high=64)
      _checks.boolean(self.reprofile, "reprofile")
    except _checks.InputError as err:
      raise self._error(str(err)) from None

  def _check_leaves(self, params: Any, batch: Any) -> None:
    """Refuses leaves ``jax.value_and_grad`` would refuse, naming the path.

    Every leaf of ``params`` and ``batch`` must be an array (anything with a
    ``shape`` and a ``dtype``: jax or numpy arrays, numpy scalars,
    ``jax.ShapeDtypeStruct`` for ``lower``). In training mode parameters
    must be floating point (or complex): ``jax.value_and_grad`` raises for
    integer and boolean inputs, and so does this.
    """
    for what, tree in (("params", params), ("batch", batch)):
      for path, leaf in jax.tree_util.tree_leaves_with_path(tree):
        where = f"{what}{jax.tree_util.keystr(path)}"
        if not (hasattr(leaf, "shape") and hasattr(leaf, "dtype")):
          raise self._error(
              f"leaf {where} is a {type(leaf).__name__} ({leaf!r:.40}), not"
              f" an array; wrap it with jnp.asarray(...) (or close over it"
              f" in the function if it is a constant)")
        dtype = leaf.dtype
        if (what == "params" and self.mode == "train"
            and not jax.numpy.issubdtype(dtype, jax.numpy.inexact)):
          raise self._error(
              f"parameter {where} has dtype {dtype}; jax.value_and_grad"
              f" needs floating-point (or complex) inputs and raises for"
              f" {dtype} too. Cast it (e.g. .astype(jnp.float32)), pass it in"
              f" the batch, or close over it in the function")

  def _graph(self, num_devices: int) -> BlockGraph | Placement:
    p = self.placement
    if isinstance(p, str):
      try:
        return _placements.get(p, num_devices)
      except PlacementError as err:
        raise self._error(str(err)) from None
    if isinstance(p, (BlockGraph, Placement)):
      return p
    if isinstance(p, (Mapping, Sequence)):
      return Placement(p)
    raise self._error(
        f"placement must be a tj.placements graph, a tj.Placement, a name or"
        f" a list of device tuples per block; got {type(p).__name__}")

  def build(self, params: Any, batch: Any) -> Built:
    """Traces, searches and lowers for these input shapes (cached)."""
    self._check_leaves(params, batch)
    shards = self._shards(params)
    axes = self._axes(params)
    key = (jax.tree_util.tree_structure(params),
           tuple((tuple(x.shape), str(x.dtype))
                 for x in jax.tree_util.tree_leaves((params, batch))),
           jax.tree_util.tree_structure(batch), tuple(sorted(shards.items())),
           axes[0], tuple(sorted(axes[2].items())))
    if key not in self._cache:
      if self.auto:
        from tessel_jax import auto  # pylint: disable=import-outside-toplevel
        built, choice = auto.auto_build(self, params, batch)
        self._cache[key] = dataclasses.replace(built, report=dataclasses.replace(
            built.report, chosen_plan=choice.describe()))
        self._choices[key] = choice
      else:
        self._cache[key] = self._build(params, batch, shards, axes)
    self._last = self._cache[key]
    self.choice = self._choices.get(key)
    return self._last

  def _shards(self, params: Any) -> dict[int, int]:
    """Parameter leaves sharded over the pipe axis: leaf -> sharded dim
    (``param_sharding.sharded_leaves``)."""
    return _param_sharding.sharded_leaves(
        params, self.param_sharding, self.pipe_axis,
        int(dict(self.mesh.shape)[self.pipe_axis]), self._error)

  def _axes(self, params: Any
            ) -> tuple[tuple[str, ...], tuple[str, ...], dict[int, tuple]]:
    """``(data axes, GSPMD axes, leaf -> spec entries over GSPMD axes)``.

    Warns (once per shape) when ``data_axes`` is not given and the mesh has
    axes besides the pipe axis. A leaf split over a data axis is FSDP.
    """
    fail = self._error
    data, auto, warning = _param_sharding.resolve_axes(
        tuple(self.mesh.axis_names), self.pipe_axis, self.data_axes,
        _param_sharding.spec_axes(params, self.param_sharding, fail), fail)
    specs = _param_sharding.auto_specs(params, self.param_sharding,
                                       self.pipe_axis, data, auto, fail,
                                       mesh_shape=dict(self.mesh.shape))
    if warning is not None and (data, auto) not in self._warned:
      self._warned.add((data, auto))
      warnings.warn(f"tessel_jax.schedule applied to {self.fn_name!r}:"
                    f" {warning}", UserWarning, stacklevel=4)
    return data, auto, specs

  def _build(self, params: Any, batch: Any,
             shards: Mapping[int, int] | None = None,
             axes: Any = None) -> Built:
    shards = dict(shards or {})
    t0 = time.perf_counter()
    clock = _progress.Clock(self.fn_name)
    data_axes, _, specs = axes if axes is not None else self._axes(params)
    num_devices, n_total, n_local = self._counts(data_axes)
    traced, rows, microbatch, p_avals = self._trace(params, batch, n_total)
    clock.lap("trace")
    train = self.mode == "train"
    # Leaves sharded by the user are stored whole (a scanned stack is not
    # cut into per-block slices), so their specs keep naming the same leaves.
    graph, part, traced = self._partition_graph(
        traced, num_devices, train, split_leaves=not (shards or specs))
    forward_of = {b.id: _placements.forward_index(b) for b in graph.blocks}
    reach = forward_reach(graph, forward_of)
    local_parts = self._local_parts(graph, rows, microbatch, p_avals, part,
                                    traced, reach, num_devices)
    clock.lap("cut", f"{len(part.blocks)} forward blocks")
    found = self._search_kernels(
        graph, part, traced, local_parts, forward_of, shards, params, rows,
        n_total, n_local, num_devices, train, clock,
        split={l: (spec, _spec_parts(spec, dict(self.mesh.shape)))
               for l, spec in specs.items()},
        data_sizes={a: int(dict(self.mesh.shape)[a]) for a in data_axes})
    ks, layout, costs, sgraph, unit, schedule, unrolled = found
    if self.has_aux:
      _shared_aux.check(part, ks, local_parts)

    def make_plan(actions: Any) -> Any:
      return _plan.build_plan(ks, actions, n_local, num_devices, layout,
                              max_period=self.max_loop_period,
                              interpret_ramps=self.interpret_ramps,
                              collective=frozenset(
                                  kid for kid, k in ks.kernels.items()
                                  if len(k.devices) == num_devices and
                                  any(l in shards for l in k.params)))

    def program_of(p: Any) -> Any:  # the lowered program of plan ``p``
      prog = _lower.Lowering(p, part, layout, compat.auto_mesh(self.mesh),
                             self.pipe_axis, data_axes, train,
                             n_total).program()
      return (prog if traced.leaf_split is None else
              traced.leaf_split.wrap(prog, train))

    # Predictions calibrate the tick model on each plan's own program
    # (not in a screening build, see below).
    self._costs.time_program = (
        _calibrate.program_timer(program_of, params, batch)
        if costs is not None and not getattr(self, "screening", False)
        else None)
    plan = make_plan(unrolled.actions)
    chosen, other_ms = None, None
    # A screening build (tessel_jax.plans, placement="auto") prices only
    # the schedule searched on measured spans.
    if (costs is not None and self.plan is None and
        not getattr(self, "screening", False)):
      alt = self._uniform_candidate(graph, ks, unit, layout, n_local,
                                    num_devices, costs)
      plan, chosen, other_ms, picked = self._pick_schedule(
          costs, unrolled, plan, alt, make_plan)
      if picked is not None:
        sgraph, schedule, unrolled = picked
      clock.lap("search on uniform spans", f"lowering the schedule searched"
                f" on {chosen} spans, predicted faster")
    lowering = _lower.Lowering(plan, part, layout,
                               compat.auto_mesh(self.mesh), self.pipe_axis,
                               data_axes, train, n_total)
    program = lowering.program()
    out_shardings = (lowering.out_shardings(self.mesh)
                     if compat.has_explicit_axes(self.mesh) else None)
    if traced.leaf_split is not None:  # stacked leaves stored as slices
      program = traced.leaf_split.wrap(program, train)
      out_shardings = None  # the wrapper re-stacks the sliced gradients
    jitted = jax.jit(program, out_shardings=out_shardings)
    report = self._costs.report(
        costs, unrolled, plan, layout, unit,
        self._memory_limit_bytes(layout, costs), self.mesh, self.pipe_axis,
        schedule_costs=chosen, alternative_ms=other_ms)
    self._costs.time_program = None
    if report is not None:
      report = dataclasses.replace(report, block_modes=block_modes(ks))
    clock.lap("lower", f"plan {plan.loop_summary()}")
    clock.total("built (compiles at the first call)")
    return Built(graph=sgraph, schedule=schedule, unrolled=unrolled, plan=plan,
                 partition=part, kernels=ks, layout=layout, memory_unit=unit,
                 jitted=jitted, build_seconds=time.perf_counter() - t0,
                 report=report,
                 profile=costs.profile if costs is not None else None,
                 lowering=lowering)

  def _counts(self, data_axes: Sequence[str]) -> tuple[int, int, int]:
    """``(pipe devices, N, N per data replica)`` with ``data_axes`` splitting
    the batch."""
    shape = dict(self.mesh.shape)
    pipe = self.pipe_axis
    num_devices = int(shape[pipe])
    replicas = int(np.prod([shape[a] for a in data_axes])) if data_axes else 1
    n_total = int(self.num_microbatches)
    if n_total % replicas:
      raise self._error(
          f"num_microbatches={n_total} does not divide over the"
          f" {replicas} data-parallel replicas of mesh axes {data_axes}; use a"
          f" multiple of {replicas}")
    return num_devices, n_total, n_total // replicas

  def _trace(self, params: Any, batch: Any, n_total: int) -> tuple:
    """``(traced, rows, microbatch avals, param avals)`` of one micro-batch."""
    name = self.fn_name
    b_leaves = jax.tree_util.tree_leaves(batch)
    rows = _partition.check_divisible(
        name, [jax.ShapeDtypeStruct(x.shape, x.dtype) for x in b_leaves],
        n_total)
    microbatch = jax.tree_util.tree_map(
        lambda x: jax.ShapeDtypeStruct((rows,) + tuple(x.shape[1:]), x.dtype),
        batch)
    p_avals = jax.tree_util.tree_map(
        lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), params)
    traced = _partition.trace(self.fn, name, p_avals, microbatch,
                              has_aux=self.has_aux)
    return traced, rows, microbatch, p_avals

  def _partition_graph(self, traced: Any, num_devices: int, train: bool,
                       split_leaves: bool = False
                       ) -> tuple[BlockGraph, Any, Any]:
    """The placement's graph, ``fn`` cut into its forward blocks and the
    cut trace (``split_leaves``: see ``_cut``)."""
    source = self._graph(num_devices)
    pipe = self.pipe_axis
    if isinstance(source, Placement):
      traced = self._cut(traced, source.num_blocks, "the hand-made Placement",
                         num_devices,
                         [1.0 / len(devs) for devs in source.devices],
                         split_leaves=split_leaves)
      for devs in source.devices:
        for d in devs:
          if not 0 <= d < num_devices:
            raise self._error(
                f"the Placement puts a block on device {d}, but the"
                f" {pipe!r} axis has devices 0..{num_devices - 1}")
      part = _partition.partition(traced)
      return source.to_graph(num_devices, part.edges, self.mode), part, traced
    graph = source
    if graph.num_devices != num_devices:
      raise self._error(
          f"placement {graph.name!r} is for {graph.num_devices} devices but"
          f" mesh axis {pipe!r} has {num_devices}; build the placement with"
          f" {num_devices} devices")
    if not train:
      graph = forward_only(graph)
    elif not any(b.kind == "B" for b in graph.blocks):
      raise self._error(
          f"placement {graph.name!r} has no backward blocks, so it cannot"
          f" train; build it with mode='train' or call with mode='infer'")
    count = forward_count(graph)
    try:
      forward_of = {b.id: _placements.forward_index(b) for b in graph.blocks}
    except PlacementError as err:
      raise self._error(str(err)) from None
    shared = {forward_of[b.id]: len(b.devices) for b in graph.blocks
              if b.kind == "F"}
    traced = self._cut(traced, count, f"placement {graph.name!r}",
                       num_devices,
                       [1.0 / shared.get(i, 1) for i in range(count)],
                       split_leaves=split_leaves)
    return graph, _partition.partition(
        traced, forward_reach(graph, forward_of)), traced

  def _search_kernels(self, graph: BlockGraph, part: Any, traced: Any,
                      local_parts: Any, forward_of: Any,
                      shards: Mapping[int, int], params: Any, rows: int,
                      n_total: int, n_local: int, num_devices: int,
                      train: bool, clock: Any,
                      split: Mapping[int, Any] | None = None,
                      data_sizes: Mapping[str, int] | None = None) -> tuple:
    """Kernels, layout, costs and the searched schedule; blocks recompute
    their activations (the one stashing most first) until one fits.
    ``split``: leaf -> (spec, pieces) of leaves sharded over GSPMD or data
    axes; ``data_sizes``: data axis -> devices (leaves split over one are
    FSDP).

    Returns ``(kernels, layout, costs, search graph, memory unit, schedule,
    unrolled)``.
    """
    seeds = _kernels.loss_seeds(part, n_total) if train else None
    keep = self._initial_keep(len(part.blocks))
    while True:
      ks = _kernels.build_kernels(part, graph, train=train,
                                  microbatch_rows=rows, keep=keep,
                                  seeds=seeds, forward_of=forward_of,
                                  local_parts=local_parts)
      gathered = _param_sharding.subset_readers(shards, ks, num_devices)
      layout = _packing.make_layout(
          traced.param_avals,
          {i: _param_sharding.stored_params(ks.kernels[ks.forward_ids[i]],
                                            gathered, num_devices)
           for i in ks.forward_ids},
          {i: ks.kernels[ks.forward_ids[i]].devices for i in ks.forward_ids},
          num_devices, mode=self.param_layout,
          shards={l: (ax, num_devices) for l, ax in shards.items()},
          split=split, gathered=gathered, data_sizes=data_sizes)
      clock.lap("kernels", f"{len(ks.kernels)} kernels")
      costs = None
      if self._costs.measured:
        stage = _stage.stage_of(self.mesh, self.pipe_axis,
                                tuple(data_sizes or ()), layout)
        costs = self._costs.search_graph(graph, ks, traced.param_avals,
                                         self.mesh, self.pipe_axis, part,
                                         stage=stage)
        sgraph, unit = costs.graph, costs.memory_unit
        clock.lap("profile")
        bound = getattr(self, "price_bound", None)  # tessel_jax.plans pruning
        if bound is not None:
          bound(costs, n_local)
      else:
        sgraph, unit = self._search_graph(graph, ks)
      try:
        searches = self.searches
        schedule, unrolled = self._schedule(sgraph, unit, layout, n_local,
                                            num_devices, costs)
        clock.lap("search", _search_note(schedule, unrolled,
                                         self.searches > searches))
        return ks, layout, costs, sgraph, unit, schedule, unrolled
      except _InfeasibleMemory as err:
        candidates = [i for i, k in keep.items() if k]
        if not candidates or self.recompute is not None:
          note = (" (every block already recomputes its activations)"
                  if not candidates else "")
          raise self._error(f"{err}{note}") from None
        # Recompute the block that stashes the most, then search again.
        worst = max(candidates, key=lambda i: ks.kernels[
            ks.forward_ids[i]].stash_bytes)
        keep[worst] = False

  def _pick_schedule(self, costs: Any, unrolled: UnrolledSchedule,
                     plan: Any, alt: Any, make_plan: Callable[[Any], Any]
                     ) -> tuple:
    """The integer search sees blocks on independent devices; the
    prediction also knows the lowering's per-tick costs, rendezvous and
    shared CPU cores. Lowers whichever of the schedules searched on the
    measured and on uniform spans (``alt``) it predicts faster.

    Returns ``(plan, "measured" | "uniform", other's predicted ms,
    (graph, schedule, unrolled) of the uniform one or None)``.
    """
    if alt is None:
      return plan, "measured", None, None
    alt_plan = make_plan(alt[2].actions)
    mine, theirs = _cost_model.agree([
        self._costs.predict(costs, unrolled, plan, self.mesh,
                            self.pipe_axis)[0].step_seconds,
        self._costs.predict(costs, alt[2], alt_plan, self.mesh,
                            self.pipe_axis)[0].step_seconds])
    # every process lowers the same schedule
    if theirs < mine:
      return alt_plan, "uniform", mine * 1e3, alt
    return plan, "measured", theirs * 1e3, None

  def _local_parts(self, graph: BlockGraph, rows: int, microbatch: Any,
                   p_avals: Any, part: Any, traced: Any, reach: Any,
                   num_devices: int) -> dict[int, Any]:
    """``g`` -> the partition of ``fn`` traced at ``rows / g`` rows, for
    every ``g`` sharing a forward block (what a split block runs), its
    blocks' exports and inputs paired with ``part``'s by where they are
    computed (``passes.align``). A ``g`` whose re-trace fails is left out:
    its blocks run replicated."""
    out = {}
    for g in sorted({len(b.devices) for b in graph.blocks if b.kind == "F"}):
      if g <= 1 or rows % g:
        continue
      local_mb = jax.tree_util.tree_map(
          lambda x, g=g: jax.ShapeDtypeStruct((rows // g,) + tuple(
              x.shape[1:]), x.dtype), microbatch)
      try:
        local = _partition.trace(self.fn, self.fn_name, p_avals, local_mb,
                                 has_aux=self.has_aux)
        local = self._cut(local, len(part.blocks), "", num_devices,
                          like=traced)
        out[g] = _align.align_partition(part,
                                        _partition.partition(local, reach))
      except (TesselError, TypeError, ValueError, IndexError):
        continue  # the function does not trace at rows / g: replicate
    return out

  def _uniform_candidate(self, graph: BlockGraph, ks: Any, unit: int,
                         layout: Any, n_local: int, num_devices: int,
                         costs: Any) -> Any:
    """``(graph, schedule, unrolled)`` searched on uniform spans under the
    same memory limit, or None when there is none."""
    alt_graph, alt_unit = self._search_graph(graph, ks)
    if alt_unit != unit:
      return None
    try:
      alt_sched, alt_unrolled = self._schedule(alt_graph, unit, layout,
                                               n_local, num_devices, costs)
    except (_InfeasibleMemory, TesselError):
      return None
    return alt_graph, alt_sched, alt_unrolled

  def _cut(self, traced: Any, count: int, what: str, num_devices: int,
           weights: Sequence[float] | None = None, like: Any = None,
           split_leaves: bool = False) -> Any:
    """``traced`` with ``count`` forward blocks: its markers or the auto cut.

    ``like``: the cut full-size trace, whose cut a re-trace (per-device rows
    of a shared block) reuses. ``split_leaves``: store a scanned stack's
    parameter leaves as one leaf per block's slice (``autocut.cut_to``).
    """
    markers = self.cut == "markers" or (self.cut is None and
                                        traced.num_blocks > 1)
    if markers and like is None and traced.num_blocks != count:
      raise self._count_error(traced.num_blocks, count, what, num_devices)
    return _autocut.cut_to(
        traced, count, fn_name=self.fn_name, cut=self.cut, like=like,
        cost="analytic" if self.cost == "uniform" else "measured",
        train=self.mode == "train", weights=weights,
        device=self.mesh.devices.flat[0], what=what,
        split_leaves=split_leaves)

  def _count_error(self, have: int, want: int, what: str,
                   num_devices: int) -> TesselError:
    fits = fitting_placements(have, num_devices)
    hint = (f"; placements with {have} forward blocks on {num_devices}"
            f" devices: {', '.join(fits)}" if fits else
            f"; no named placement has {have} forward blocks on"
            f" {num_devices} devices")
    diff = want - have
    change = (f"add {diff} tj.boundary call{'s' if diff > 1 else ''}" if diff > 0
              else f"remove {-diff} tj.boundary call{'s' if diff < -1 else ''}")
    return self._error(
        f"the function has {have} blocks ({have - 1} tj.boundary calls) but"
        f" {what} has {want} forward blocks; {change}, remove every"
        f" tj.boundary (or pass cut='auto') to let tessel_jax cut the function"
        f" by cost, or pick a placement with {have} blocks{hint}")

  def _initial_keep(self, num_blocks: int) -> dict[int, bool]:
    r = self.recompute
    if r is None or r is False:
      return {i: True for i in range(num_blocks)}
    if r is True:
      return {i: False for i in range(num_blocks)}
    chosen = {int(i) for i in r}
    return {i: i not in chosen for i in range(num_blocks)}

  def _search_graph(self, graph: BlockGraph,
                    ks: Any) -> tuple[BlockGraph, int]:
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

  def _memory_limit_bytes(self, layout: Any, costs: Any = None) -> int | None:
    """Bytes per device left for the stash (None: no limit).

    ``memory_limit`` (or what the device reports) less the parameters, their
    gradient accumulators and ``optimizer_slots`` parameter-sized optimiser
    arrays, and (measured costs) the largest kernel workspace (XLA temp
    bytes).
    """
    limit = self.memory_limit
    if limit is None:
      limit = compat.device_memory_limit(self.mesh.devices.flat[0])
    if limit is None:
      return None
    fixed = max(layout.fixed_bytes_per_device(int(self.optimizer_slots)))
    if costs is not None:
      fixed += costs.workspace_bytes
    return max(0, int(limit) - fixed)

  def _memory_units(self, unit: int, layout: Any, num_devices: int,
                    costs: Any = None) -> int | None:
    del num_devices
    limit = self._memory_limit_bytes(layout, costs)
    if limit is None:
      return None
    # Above this many units every quantised graph is effectively unlimited.
    return min(limit // unit, _checks.MAX_MEMORY_LIMIT)

  def _schedule(self, graph: BlockGraph, unit: int, layout: Any, n_local: int,
                num_devices: int, costs: Any = None
                ) -> tuple[Schedule | None, UnrolledSchedule]:
    plan = self.plan
    if isinstance(plan, UnrolledSchedule):
      if plan.num_microbatches != n_local:
        raise self._error(
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
        raise self._error(str(err)) from None
    from tessel_jax import search  # pylint: disable=import-outside-toplevel
    limit = self._memory_units(unit, layout, num_devices, costs)
    cache = _schedule_cache.ScheduleCache(self.cache_dir)
    key = _schedule_cache.schedule_key(
        graph, limit, n_local, {"time_limit_s": self.solver_time_limit_s,
                                "seed": self.seed})
    hit = cache.load(key, graph, n_local, limit)
    if hit is not None:
      self.schedule_cache_hits += 1
      return hit
    self.searches += 1
    try:
      sched = search.search_repetend(graph, memory_limit=limit,
                                     time_limit_s=self.solver_time_limit_s,
                                     seed=self.seed)
    except search.InfeasibleScheduleError as err:
      need = err.min_memory_limit
      extra = (f"; the stash needs at least {need * unit} bytes per device"
               f" beyond parameters, gradients, optimiser state"
               f" (optimizer_slots={self.optimizer_slots}) and kernel"
               f" workspace" if need else "")
      raise _InfeasibleMemory(
          f"no schedule fits the memory limit {self.memory_limit} bytes per"
          f" device{extra}. Raise memory_limit, or recompute activations"
          f" (recompute=True or a list of blocks)") from None
    unrolled = sched.unroll(n_local)
    cache.store(key, sched, unrolled)
    return sched, unrolled


def _spec_parts(spec: Sequence[Any], shape: Mapping[str, int]) -> int:
  """How many pieces a ``PartitionSpec``'s entries cut a leaf into."""
  parts = 1
  for e in spec:
    for a in (e if isinstance(e, (tuple, list)) else (e,) if e else ()):
      parts *= int(shape[a])
  return parts


def _search_note(sched: Schedule | None, unrolled: UnrolledSchedule,
                 searched: bool) -> str:
  """What the search phase did, for its progress line."""
  if sched is None:
    return f"{unrolled.source}, makespan {unrolled.makespan}"
  how = "searched" if searched else "from the schedule cache"
  return f"{how}, period {sched.period}, makespan {unrolled.makespan}"


class _InfeasibleMemory(Exception):
  """Internal: the search found no schedule under the memory limit."""


def schedule(fn: Callable[..., Any] | None = None, *, mesh: Any,
             placement: Any, num_microbatches: int | None = None,
             mode: str = "train",
             memory_limit: int | None = None, pipe_axis: str = "pipe",
             solver_time_limit_s: float = 30.0, plan: Any = None,
             recompute: Any = None, seed: int = 0,
             max_loop_period: int = 64, param_layout: str = "auto",
             interpret_ramps: int | None = 8,
             param_sharding: Any = None, cost: str | None = None,
             time_resolution: float | None = None, reprofile: bool = False,
             link: Any = None, cache_dir: str | None = None,
             optimizer_slots: int = 0, cut: str | None = None,
             has_aux: bool = False, verbose: bool = False,
             data_axes: Any = None) -> Any:
  """Pipelines ``fn(params, batch)`` over mesh axis ``pipe_axis``.

  Args:
    fn: ``fn(params, microbatch)``; in training it returns a scalar loss
      (``(loss, aux)`` with ``has_aux=True``).
      Omit it to use ``schedule`` as a decorator.
    mesh: A ``jax.sharding.Mesh`` with the pipe axis; ``data_axes`` says
      which other axes split the batch, the rest are left to GSPMD.
    placement: A ``tj.placements`` BlockGraph (e.g. ``mshape(4)``), its name
      (``"mshape"``), a :class:`Placement`, a list of device tuples per
      block, or ``"auto"``: every plan that makes sense on this mesh (named
      placements that fit, ``pipe x data`` widths of a 1-D mesh, micro-batch
      counts, searched and classic schedules) is priced with the cost model
      (``tj.frontier``) and the fastest predicted one whose peak fits
      ``memory_limit`` is lowered; ``step.report.chosen_plan`` names it, its
      predicted step and peak and the runner-up (``step.choice`` has every
      plan).
    num_microbatches: ``N``; the batch is split along axis 0 into ``N``
      micro-batches (divided evenly over data-parallel replicas). None with
      ``placement="auto"``: the counts that divide the batch are tried.
    mode: ``"train"``: ``(loss, grads)`` equal to ``jax.value_and_grad`` of
      the mean of ``fn`` over micro-batches. ``"infer"``: ``fn``'s outputs
      for every micro-batch, concatenated along axis 0 (scalars stacked).
    has_aux: As in ``jax.value_and_grad(has_aux=True)``: ``fn`` returns
      ``(loss, aux)`` with ``aux`` a pytree of arrays (metrics, BatchNorm
      running statistics, RNG state). Training returns ``((loss, aux),
      grads)``: ``loss`` the mean over micro-batches, ``aux`` with every
      leaf stacked per micro-batch, shape ``(N, ...)`` over all ``N``
      micro-batches (data-parallel replicas in order), not differentiated.
      Inference returns ``(outputs, aux)``: ``outputs`` as without
      ``has_aux``, ``aux`` stacked per micro-batch the same way. Aux values
      may be computed anywhere in ``fn`` (non-affine and non-differentiable
      code is fine); one without a batch axis computed in a block whose
      rows are split over several devices must be a float mean over the rows
      (anything else is refused by name, ``passes.shared_aux``).
    memory_limit: Bytes per device (default: what the device reports; none
      on CPU). The stash gets what is left after the parameters, their
      gradients, ``optimizer_slots`` optimiser arrays and (measured costs)
      the largest kernel workspace.
    pipe_axis: Mesh axis of the pipeline.
    data_axes: Mesh axes that split the batch (data parallel): each data
      replica runs the pipeline on its share of the micro-batches and the
      gradients are summed over them once at the end. Every other axis is
      left to GSPMD inside the blocks (the program's ``shard_map`` is
      manual over the pipe and data axes only): parameters sharded over it
      (a ``NamedSharding`` on the arrays or ``param_sharding=``, e.g.
      Megatron's ``P(None, "model")`` / ``P("model", None)``) stay sharded
      inside every block, each device storing its shard,
      ``jax.lax.with_sharding_constraint`` in ``fn`` is honoured, and the
      gradients come back with the parameters' shardings. A parameter
      sharded over a data axis (``P("data", None)``, or
      ``P(("data", "model"), None)`` with tensor parallelism) is FSDP
      (ZeRO-3): each data replica stores its shard, the program gathers it
      once per step before the first tick and reduce-scatters its gradient
      after the last. None (default): the axes no
      parameter sharding names split the batch and the others are left to
      GSPMD, with a warning when the mesh has axes besides ``pipe_axis``.
    solver_time_limit_s: CP-SAT time budget.
    plan: None (search), a classic schedule by name (``"gpipe"``,
      ``"1f1b"``, ``"interleaved_1f1b"`` alias ``"interleaved"``,
      ``"chimera"``, ``"zb_h1"`` alias ``"zb"``, ``"dualpipev"``,
      ``"zbv"``; see
      ``tessel_jax.search.baselines`` for the placements each fits), a
      ``Schedule`` or an ``UnrolledSchedule`` to lower instead.
    recompute: None (keep residuals; recompute the largest blocks only if
      the memory limit requires it), True (recompute all), or forward block
      indices to recompute.
    seed: CP-SAT seed.
    max_loop_period: Longest loop body (ticks) the lowering looks for.
    param_layout: ``"auto"`` (slot arrays for parameter shapes that are
      balanced over the devices, and for leaves of 64 KiB or more with at
      most half of their slot rows empty; a flat buffer for the rest),
      ``"slots"`` or ``"flat"``; see ``passes.packing``.
    interpret_ramps: Straight-line stretches (warmup, cooldown) of at least
      this many ticks run as one table-driven loop over a switch of all their
      kernels instead of unrolled pruned ticks: compile time stops growing
      with the ramp length, each ramp tick runs a little slower. None:
      always unroll. 0: no loops either, every tick in one table-driven
      loop, so each kernel body is compiled once (measured: compile 32-46%
      less CPU, steps 3-12% more CPU; see BENCHMARKS.md "compile").
    param_sharding: Parameters to shard over the pipe axis: a pytree like
      ``params`` (or a prefix of it) of ``jax.sharding.PartitionSpec`` or
      None, e.g. ``{"wte": P("pipe", None), "layers": None}`` for a
      vocab-sharded embedding. A spec names the pipe axis on at most one
      dimension (divisible by the pipe axis size) and None elsewhere. When
      omitted, leaves that are arrays with a ``NamedSharding`` whose spec
      names the pipe axis are sharded the same way. A sharded leaf is stored
      as 1/D of it per device (the layout's byte counts and the memory limit
      follow). A block on *every* device of the pipe axis (mshape's ``F0``,
      mllm's first and last blocks) gathers it with one ``all_gather`` over
      the pipe axis at its tick (any code works; the block still splits the
      micro-batch rows over the devices) and its gradient is reduced and
      re-sharded with one ``psum_scatter``. A block on a strict subset
      (mshape's head reading a tied embedding) reads the full leaf gathered
      onto its devices with static ``ppermute``s before the first tick, its
      gradient scattered back to the shards after the last, both outside
      every branch (``passes.gather``; the full-leaf buffer is counted in
      the layout's bytes on every device). The returned gradient has the
      leaf's full shape.
    cost: ``"measured"`` (default): every kernel is compiled alone and timed
      on the mesh's first device (median of repeats, cached on disk), and
      the search runs on the measured seconds (quantised to
      ``time_resolution``), stash bytes and communication delays; the
      schedule searched on uniform spans is searched too, and the one with
      the smaller predicted step time is lowered (``step.report`` says
      which).
      ``"uniform"``: spans F=1, B=2, W=1, nothing measured. When omitted,
      the ``TESSEL_JAX_COST`` environment variable decides (default
      ``"measured"``).
    time_resolution: Seconds per search step (None: the coarsest step that
      keeps the rounding error of the blocks within 5%, with at most 24
      steps per micro-batch on the busiest device).
    reprofile: Measure again even when the cache has the kernels.
    link: Communication model for edge delays: None (defaults of the
      backend, ``tessel_jax.cost.link.DEFAULTS``), a
      ``tessel_jax.cost.LinkModel``, or ``"measure"`` (a ``ppermute``
      microbenchmark on the mesh, cached).
    cache_dir: Directory of the measurement cache and of the searched
      schedules (``tessel_jax.schedule_cache``: a second process with the
      same search graph, memory limit, N, time limit and seed reuses the
      schedule after validating it) (None: ``$TESSEL_JAX_CACHE`` or
      ``~/.cache/tessel_jax``).
    optimizer_slots: Parameter-sized optimiser arrays per parameter (Adam:
      2), subtracted from the memory limit and counted in the report's peak.
    cut: How ``fn`` is cut into the placement's forward blocks. None
      (default): at its ``tj.boundary`` markers when it has any, else
      automatically; ``"auto"``: automatically, ignoring any markers;
      ``"markers"``: at the markers only (their count must match). The
      automatic cut (``passes.autocut``) is an optimal dynamic programme
      over the positions between top-level operations (nested ``jax.jit``
      inlined): it minimises the busiest block's forward(+backward) time
      (measured per group of operations on the mesh's first device; a
      roofline estimate with ``cost="uniform"``; a block shared by ``g``
      devices counts ``1/g``), then, within 3% of that, the bytes live
      across the cuts.
    verbose: Show the first call's progress on stderr, one line per phase
      with its time (trace, cut, kernels, profile, search, lower, compile).
      They are INFO records of the ``"tessel_jax"`` logger either way, so an
      application logging at INFO shows them without this.

  Returns:
    A :class:`ScheduledFunction` (or a decorator making one).
  """
  kwargs = dict(mesh=mesh, placement=placement,
                num_microbatches=num_microbatches, mode=mode,
                memory_limit=memory_limit, pipe_axis=pipe_axis,
                solver_time_limit_s=solver_time_limit_s, plan=plan,
                recompute=recompute, seed=seed,
                max_loop_period=max_loop_period, param_layout=param_layout,
                interpret_ramps=interpret_ramps, param_sharding=param_sharding,
                cost=cost, time_resolution=time_resolution,
                reprofile=reprofile, link=link, cache_dir=cache_dir,
                optimizer_slots=optimizer_slots, cut=cut, has_aux=has_aux,
                verbose=verbose, data_axes=data_axes)
  if fn is None:
    return lambda f: ScheduledFunction(f, **kwargs)
  return ScheduledFunction(fn, **kwargs)
