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

The pieces: ``scheduled.ScheduledFunction`` (the returned step),
``step_checks`` (options and inputs), ``step_build`` (one build; tracing
and cutting in ``step_cut``, the schedule in ``step_schedule``), ``built``
(what a build made) and ``placed_step`` (already-placed parameters). This
module holds ``schedule`` and keeps every name it always offered.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from tessel_jax.built import Built, block_modes
from tessel_jax.hand_placement import Placement
from tessel_jax.scheduled import COST_ENV, ScheduledFunction
from tessel_jax.step_checks import MODES
from tessel_jax.step_schedule import MEMORY_UNITS

try:  # installed: passes/ is tessel_jax.passes
  from tessel_jax.passes import boundary as _boundary  # type: ignore
  from tessel_jax.passes import errors as _errors  # type: ignore
except ImportError:  # run from the repository root
  from passes import boundary as _boundary  # type: ignore
  from passes import errors as _errors  # type: ignore

TesselError = _errors.TesselError
boundary = _boundary.boundary

__all__ = ["COST_ENV", "MEMORY_UNITS", "MODES", "Built", "Placement",
           "ScheduledFunction", "TesselError", "block_modes", "boundary",
           "schedule"]


def schedule(fn: Callable[..., Any] | None = None, *, mesh: Any,
             placement: Any, num_microbatches: int | None = None,
             mode: str = "train",
             memory_limit: int | None = None, pipe_axis: str = "pipe",
             solver_time_limit_s: float = 30.0, plan: Any = None,
             recompute: Any = None, seed: int = 0,
             max_loop_period: int = 64, param_layout: str = "auto",
             interpret_ramps: int | str | None = "auto",
             param_sharding: Any = None, cost: str | None = None,
             time_resolution: float | None = None, reprofile: bool = False,
             link: Any = None, cache_dir: str | None = None,
             optimizer_slots: int = 0, cut: str | None = None,
             has_aux: bool = False, verbose: bool = False,
             data_axes: Any = None, fsdp: str = "auto",
             switches: Any = None) -> Any:
  """Pipelines ``fn(params, batch)`` over mesh axis ``pipe_axis``.

  Every option is named here with its values and default; the details live
  with the code that implements them (named per option) and in README.md.

  Args:
    fn: ``fn(params, microbatch)`` returning a scalar loss in training
      (``(loss, aux)`` with ``has_aux``). Omit it to use a decorator.
    mesh: A ``jax.sharding.Mesh`` with the pipe axis.
    placement: A ``tj.placements`` BlockGraph (``mshape(4)``), its name
      (``"mshape"``), a :class:`Placement`, a list of device tuples per
      block, or ``"auto"``: every plan that fits the mesh is priced and the
      fastest one whose peak fits ``memory_limit`` is lowered
      (``tessel_jax.plans``; ``step.report.chosen_plan``, ``step.choice``).
    num_microbatches: ``N``: the batch is split along axis 0 (evenly over
      data replicas). None with ``placement="auto"``: each count that
      divides the batch is tried.
    mode: ``"train"`` (default): ``(loss, grads)`` equal to
      ``jax.value_and_grad`` of the mean of ``fn`` over micro-batches;
      ``"infer"``: the outputs of every micro-batch concatenated on axis 0.
    memory_limit: Bytes per device (default: what the device reports; none
      on CPU). The stash gets what is left after the parameters, their
      gradients, ``optimizer_slots`` optimiser arrays, hoisted values and
      (measured costs) the largest kernel workspace; blocks recompute their
      activations until a schedule fits (``step_schedule``).
    pipe_axis: Mesh axis of the pipeline (default ``"pipe"``).
    solver_time_limit_s: CP-SAT time budget (default 30 s).
    plan: None (search), a classic schedule by name (``"gpipe"``,
      ``"1f1b"``, ``"interleaved_1f1b"``/``"interleaved"``, ``"chimera"``,
      ``"zb_h1"``/``"zb"``, ``"dualpipev"``, ``"zbv"``:
      ``tessel_jax.search.baselines``), or a ``Schedule`` /
      ``UnrolledSchedule`` to lower as given.
    recompute: None (keep residuals; recompute the largest blocks only where
      the memory limit needs it), True (all), or forward block indices.
    seed: CP-SAT seed.
    max_loop_period: Longest loop body (ticks) the lowering looks for.
    param_layout: ``"auto"`` (default), ``"slots"`` or ``"flat"``: how
      parameters are packed per device (``passes.packing``).
    interpret_ramps: Which ticks run as one table-driven loop over their
      kernels: ``"auto"`` (default: 0, the compact lowering), an integer
      ``k >= 0`` or None (``tessel_jax.ramps``). ``step.report.lowering``
      says which lowering was built and why.
    param_sharding: Leaves to shard over the pipe axis: a pytree (or
      prefix) of ``PartitionSpec`` or None naming the pipe axis on at most
      one dimension, e.g. ``{"wte": P("pipe", None)}``; default: the
      leaves' own ``NamedSharding``. Gathered where a block reads them,
      gradients returned whole (``tessel_jax.param_sharding``,
      ``passes.gather``; README "What runs where").
    cost: ``"measured"`` (kernels timed on the mesh's first device, cached
      on disk; the schedules searched on measured and on uniform spans
      are both priced and the faster is lowered), ``"calibrated"`` (also
      times each candidate program with stand-in kernels: for comparing
      plans) or ``"uniform"`` (spans F=1, B=2, W=1, nothing measured).
      Default: ``$TESSEL_JAX_COST``, else ``"measured"``
      (``tessel_jax.cost``; README "Measured costs").
    time_resolution: Seconds per search step (None: the coarsest that keeps
      the blocks' rounding within 5%, at most 24 steps per micro-batch).
    reprofile: Measure again even when the cache has the kernels.
    link: Edge delays' communication model: None (backend defaults), a
      ``tessel_jax.cost.LinkModel`` or ``"measure"`` (``ppermute``
      microbenchmark, cached).
    cache_dir: Directory of measurements and searched schedules (None:
      ``$TESSEL_JAX_CACHE`` or ``~/.cache/tessel_jax``;
      ``tessel_jax.schedule_cache``).
    optimizer_slots: Parameter-sized optimiser arrays per parameter (Adam:
      2), held against the memory limit and counted in the report's peak.
    cut: How ``fn`` is cut into forward blocks: None (default: at its
      ``tj.boundary`` markers if any, else automatically), ``"auto"``
      (automatically, ignoring markers: ``passes.autocut``) or
      ``"markers"``.
    has_aux: As in ``jax.value_and_grad(has_aux=True)``: ``aux`` comes back
      stacked per micro-batch, not differentiated (README "State and
      metrics: has_aux"; ``passes.shared_aux``).
    verbose: Log the first call's phases with their times on stderr (INFO
      records of the ``"tessel_jax"`` logger either way).
    data_axes: Mesh axes that split the batch (data parallel; gradients
      summed once at the end); every other axis is left to GSPMD inside
      the blocks (tensor parallel). A parameter sharded over a data axis is
      FSDP (``fsdp``). None: the axes no parameter sharding names, with a
      warning (README "Pipeline x tensor x data").
    fsdp: When FSDP parameters are gathered: ``"per_step"`` (once before
      the first tick), ``"per_block"`` (ZeRO-3: at each block, gradients
      reduce-scattered into shard-sized accumulators; ``passes.fsdp_tick``)
      or ``"auto"`` (default: per step unless only per block fits the
      memory limit; ``tessel_jax.fsdp_choice``).
    switches: Optional lowering steps of this step, for A/B runs
      (``passes.switches.Switches``: hoisting, ordered stash writes, tick
      compaction, residuals rebuilt in B instead of stashed); None: the
      library's (``TESSEL_JAX_TICK_ORDER=1`` compacts ticks). A named
      placement only.

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
                verbose=verbose, data_axes=data_axes, fsdp=fsdp,
                switches=switches)
  if fn is None:
    return lambda f: ScheduledFunction(f, **kwargs)
  return ScheduledFunction(fn, **kwargs)
