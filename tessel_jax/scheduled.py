"""``ScheduledFunction``: what ``tj.schedule`` returns.

It holds the options, caches one ``Built`` per set of input shapes and
runs, lowers, places and describes the last build. The work is done by
``step_checks`` (options and inputs), ``step_build`` (trace, cut, kernels,
costs, lowering; ``step_cut`` and ``step_schedule``) and ``placed_step``
(already-placed parameters).
"""

from __future__ import annotations

import dataclasses
import functools
import os
import warnings
from collections.abc import Callable, Mapping
from typing import Any

import jax

from tessel_jax import compat
from tessel_jax import param_sharding as _param_sharding
from tessel_jax import placed_step as _placed_step
from tessel_jax import progress as _progress
from tessel_jax import step_build
from tessel_jax import step_checks
from tessel_jax.built import Built, shared_modes
from tessel_jax.cost import model as _cost_model
from tessel_jax.schedule import Schedule, UnrolledSchedule

try:  # installed: passes/ is tessel_jax.passes
  from tessel_jax.passes import errors as _errors  # type: ignore
  from tessel_jax.passes import switches as _switches  # type: ignore
except ImportError:  # run from the repository root
  from passes import errors as _errors  # type: ignore
  from passes import switches as _switches  # type: ignore

COST_ENV = "TESSEL_JAX_COST"  # default of ``cost=`` when it is not given


def fn_name(fn: Callable[..., Any]) -> str:
  """The name messages give ``fn`` (its ``__name__`` or its type's)."""
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
               param_layout: str, interpret_ramps: int | str | None,
               param_sharding: Any = None, cost: str | None = None,
               time_resolution: float | None = None,
               reprofile: bool = False, link: Any = None,
               cache_dir: str | None = None, optimizer_slots: int = 0,
               cut: str | None = None, has_aux: bool = False,
               verbose: bool = False, data_axes: Any = None,
               fsdp: str = "auto", switches: Any = None):
    self.fn = fn
    self.switches = _switches.from_env() if switches is None else switches
    self.data_axes = data_axes
    self.fsdp = fsdp
    self.auto = isinstance(placement, str) and placement == "auto"
    self.choice: Any = None  # tessel_jax.plans.AutoChoice of the last build
    self.has_aux = has_aux
    self.fn_name = fn_name(fn)
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
              for _, m in shared_modes(ks)]
    return text + ("\n" + "\n".join(legend) if legend else "")

  @property
  def report(self) -> Any:
    """``CostReport`` of the last build: predicted step time (ms), per-device
    peak memory (bytes), bubble ratio, quantisation error, profiling time."""
    return self.built.report

  def build(self, params: Any, batch: Any) -> Built:
    """Traces, searches and lowers for these input shapes (cached)."""
    step_checks.check_leaves(self, params, batch)
    shards = self._shards(params)
    axes = self._axes(params)
    key = (jax.tree_util.tree_structure(params),
           tuple((tuple(x.shape), str(x.dtype))
                 for x in jax.tree_util.tree_leaves((params, batch))),
           jax.tree_util.tree_structure(batch), tuple(sorted(shards.items())),
           axes[0], tuple(sorted(axes[2].items())))
    if key not in self._cache:
      # Inside a caller's jax.jit the build still times real arrays.
      with compat.outside_traces():
        if self.auto:
          self._cache[key] = self._auto_build(key, params, batch)
        else:
          self._cache[key] = self._build(params, batch, shards, axes)
    self._last = self._cache[key]
    self.choice = self._choices.get(key)
    return self._last

  # --- building -------------------------------------------------------------

  def _error(self, problem: str) -> _errors.TesselError:
    return _errors.fail(self.fn_name, problem)

  def _check_static(self) -> None:
    """Checks the options and makes the cost model (``step_checks``)."""
    step_checks.check_options(self)
    try:
      self._costs = _cost_model.CostModel(
          cost=self.cost, time_resolution=self.time_resolution,
          reprofile=self.reprofile, link=self.link, cache_dir=self.cache_dir,
          optimizer_slots=self.optimizer_slots)
    except ValueError as err:
      raise self._error(str(err)) from None

  def _auto_build(self, key: Any, params: Any, batch: Any) -> Built:
    """``placement="auto"``: the plan ``tessel_jax.auto`` picks, built; its
    ``AutoChoice`` is kept under ``key``."""
    from tessel_jax import auto  # pylint: disable=import-outside-toplevel
    built, choice = auto.auto_build(self, params, batch)
    self._choices[key] = choice
    return dataclasses.replace(built, report=dataclasses.replace(
        built.report, chosen_plan=choice.describe()))

  def _build(self, params: Any, batch: Any,
             shards: Mapping[int, int] | None = None,
             axes: Any = None) -> Built:
    """One build for these inputs (``step_build.build``)."""
    return step_build.build(self, params, batch, shards, axes)

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

