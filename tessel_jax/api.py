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
             data_axes: Any = None, fsdp: str = "auto") -> Any:
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
      (once per step, or per block: ``fsdp``) and reduce-scatters its
      gradient. None (default): the axes no
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
    interpret_ramps: Which ticks run as one table-driven loop over a switch
      of their kernels (``passes.interp``). ``"auto"`` (default): 0, the
      compact lowering (FSDP parameters included: each kernel gathers its
      own inside its loop); ``step.report.lowering`` says which, why, and how FSDP parameters
      are gathered. 0 (compact): every tick in that one loop, remote messages
      held in outboxes until due, so each kernel body is compiled once: the
      smallest program and first call (quiet, 2 stages: step 0.91/0.92x a
      hand-written shard_map GPipe at N = 8/32, first call 1.17-1.26x it;
      BENCHMARKS.md "Quiet re-measure, session 27"). k > 0 (loops): the repetend runs
      as a ``fori_loop`` unrolling one period, straight-line stretches
      (warmup, cooldown) of at least k ticks are interpreted, shorter ones
      unrolled pruned ticks (the default with FSDP parameters, which
      interpreted ticks gather once per step, ``fsdp``); pass 8 to compare
      with the loop lowering. None: loops, every ramp unrolled.
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
      ``"calibrated"``: as ``"measured"``, and each candidate schedule's
      program is also compiled with its kernels replaced by stand-ins of the
      same shapes and timed, so the prediction includes what the program
      pays per tick around its kernels (``tessel_jax.cost.calibrate``;
      cached on disk by the program's shape). One more compile per
      candidate: for comparing plans (``placement="auto"``, ``tj.frontier``,
      ``experiments.model_zoo_spans``) rather than a first call.
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
    fsdp: When FSDP parameters (sharded over a data axis) are gathered:
      ``"per_block"`` (ZeRO-3): at the ticks of the blocks reading them,
      outside every branch (reused over a run of ticks moving the same
      slots), gradients reduce-scattered into shard-sized accumulators, so
      a device holds its shards and only the running block's gathered
      weights and gradients; ``"per_step"``: once before the first tick,
      kept for the step, gradients reduce-scattered after the last tick;
      ``"auto"`` (default): per block. In interpreted ticks
      (``interpret_ramps``, the compact default) each kernel gathers its
      own leaves (again only where the device switches block) and
      reduce-scatters its gradients inside its 0/1-trip loop, which every
      device of a data group enters or skips together
      (``passes.fsdp_kernel``).

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
                verbose=verbose, data_axes=data_axes, fsdp=fsdp)
  if fn is None:
    return lambda f: ScheduledFunction(f, **kwargs)
  return ScheduledFunction(fn, **kwargs)
