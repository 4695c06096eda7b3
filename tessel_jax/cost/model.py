"""The cost options of one scheduled function, from kernels to report.

:class:`CostModel` is what ``tessel_jax.schedule`` holds for ``cost=``,
``time_resolution=``, ``reprofile=``, ``link=``, ``cache_dir=`` and
``optimizer_slots=``:

* :meth:`CostModel.search_graph`: profile the kernels (``measure``), price
  the edges (``link``) and quantise everything into the search's graph
  (``quantize``);
* :meth:`CostModel.report`: replay the lowered schedule with the measured
  durations (``predict``, with the lowering's per-tick costs from
  ``ticks``, calibrated on the plan's stand-in program by ``calibrate``)
  into a :class:`CostReport`.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Callable, Mapping
from typing import Any

from tessel_jax import simulate
from tessel_jax.cost import cache as _cache
from tessel_jax.cost import calibrate as _calibrate
from tessel_jax.cost import call_timing as _call_timing
from tessel_jax.cost import link as _link
from tessel_jax.cost import measure as _measure
from tessel_jax.cost import outside as _outside
from tessel_jax.cost import port_pricing as _port_pricing
from tessel_jax.cost import processes as _processes
from tessel_jax.cost import predict as _predict
from tessel_jax.cost import quantize as _quantize
from tessel_jax.cost import ticks as _ticks
from tessel_jax.cost.report import CostReport
from tessel_jax.graph import BlockGraph

try:  # installed: passes/ is tessel_jax.passes
  from tessel_jax.passes import fsdp_comm as _fsdp_comm  # type: ignore
except ImportError:  # run from the repository root
  from passes import fsdp_comm as _fsdp_comm  # type: ignore

COSTS = ("measured", "calibrated", "uniform")
_LOG = logging.getLogger("tessel_jax.cost")


_local_mesh = _processes.local_mesh
_single_process = _processes.single_process
agree = _processes.agree


@dataclasses.dataclass(frozen=True, eq=False)
class SearchCosts:
  """The measured search graph of one kernel set.

  Attributes:
    graph: Integer spans, memory units and edge delays.
    memory_unit: Bytes per memory unit.
    quantized: The quantisation (real seconds and bytes, errors).
    profile: Kernel measurements.
    link: Communication model used for the delays.
    workspace_bytes: Largest kernel workspace (XLA temp bytes) on any
      device.
    workspace_per_device: Largest kernel workspace per device.
    shared_cores: CPU backend: cores the devices of one pipeline share
      (the process's cores, divided among data-parallel replicas); None on
      other backends.
    work: CPU backend: block id -> core-seconds (``core_seconds``).
    parallelism: CPU backend: block id -> cores the block can use alone.
    stage_devices: Devices of one stage (the GSPMD axes): a tick's
      per-device core-seconds (``ticks.measure_tick_costs`` on the CPU
      backend) count this many times per pipe device.
  """

  graph: BlockGraph
  memory_unit: int
  quantized: _quantize.Quantized
  profile: _measure.Profile
  link: _link.LinkModel
  workspace_bytes: int
  workspace_per_device: tuple[int, ...]
  shared_cores: float | None = None
  work: Mapping[int, float] | None = None
  parallelism: Mapping[int, float] | None = None
  stage_devices: int = 1


def block_memory_bytes(graph: BlockGraph, ks: Any,
                       profile: Any = None) -> dict[int, int]:
  """Stash bytes per block: ``F`` keeps them, ``B`` (or ``W`` when the
  backward is split) frees them. With ``profile`` (``measure.Profile``)
  the measured per-device bytes (a stage's residuals per shard)."""
  stash = {k.fwd: k.stash_bytes for k in ks.kernels.values() if k.kind == "F"}
  if profile is not None:
    stash.update({k.fwd: k.stash_bytes for k in profile.kernels.values()
                  if k.kind == "F"})
  has_w = {k.fwd for k in ks.kernels.values() if k.kind == "W"}
  out = {}
  for blk in graph.blocks:
    k = ks.kernels.get(blk.id)
    s = stash.get(k.fwd, 0) if k is not None else 0
    if blk.kind == "F":
      out[blk.id] = s
    elif blk.kind == "B":
      out[blk.id] = 0 if (k is not None and k.fwd in has_w) else -s
    else:
      out[blk.id] = -s
  return out


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
    self.cost = cost
    self.time_resolution = time_resolution
    self.link_option = link
    self.optimizer_slots = optimizer_slots
    self.repeats = repeats
    self.cache = _cache.ProfileCache(cache_dir, reprofile=reprofile)
    self._memo: dict[str, dict[str, Any]] = {}
    # Set by tessel_jax.plans for a screening build: unmeasured kernels are
    # estimated from their flops (cost.estimate) instead of compiled.
    self.estimator: Any = None
    self._link: _link.LinkModel | None = None
    self._ticks: _ticks.TickCosts | None = None
    # Set by the build: ``plan -> seconds`` compiling and timing the
    # lowered program of a plan (``calibrate.program_timer``); while set,
    # :meth:`predict` calibrates the tick model on each plan's stand-in
    # program (``calibrate``). None: the microbenchmark alone.
    self.time_program: Callable[[Any], float] | None = None
    self._standin: dict[str, float | None] = {}
    # Set by the build: ``layout -> (signature, measure)`` of the step's
    # part outside its ticks (``cost.outside``), or None (not priced).
    self.time_outside: Callable[[Any], Any] | None = None
    self._outside: dict[str, float] = {}
    self._gather_links: dict[str, _link.LinkModel] = {}
    # cost.ports: (seconds per port, fixed port operations per tick)
    self._per_port: tuple[float, float] | None = None
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
    # (``step_schedule.pick_schedule``: estimated well slower).
    self.alt_standins_skipped = 0
    # Seconds per kernel call the last prediction's stand-in added (0: none).
    self.extra_last_s = 0.0
    self._spent = 0.0
    self._measured = 0
    self._hit = True

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

  # --- search graph ---------------------------------------------------------

  def link_model(self, mesh: Any, pipe_axis: str) -> _link.LinkModel:
    """The link model (measured once per CostModel when asked, cached)."""
    if self._link is not None:
      return self._link
    mesh = _local_mesh(mesh, pipe_axis)
    opt = self.link_option
    device = mesh.devices.flat[0]
    if isinstance(opt, _link.LinkModel):
      self._link = opt
    elif opt == "measure" and int(dict(mesh.shape)[pipe_axis]) > 1:
      key = _cache.make_key({
          "what": "link", "version": _link.LINK_VERSION,
          "backend": device.platform,
          "device_kind": device.device_kind,
          "devices": int(dict(mesh.shape)[pipe_axis]),
          "xla_flags": _measure.speed_flags()})
      rec = self.cache.get("link", key)
      if rec is None:
        model = _link.measure_link(mesh, pipe_axis)
        self.cache.put("link", key, model.to_dict())
      else:
        model = _link.LinkModel(rec["latency_s"],
                                rec["bandwidth_bytes_per_s"], "measured")
      self._link = model
    else:
      self._link = _link.default_link(device.platform)
    return self._link

  def search_graph(self, graph: BlockGraph, ks: Any, param_avals: Any,
                   mesh: Any, pipe_axis: str, part: Any = None,
                   stage: Any = None) -> SearchCosts:
    """Profiles ``ks`` (of partition ``part``) and quantises ``graph``.

    With ``stage`` (``cost.stage.Stage``) every kernel is profiled on the
    devices of one stage, sharded over the GSPMD axes as the program runs
    it. In a multi-process run every process profiles its first device (or
    stage) and all use process 0's figures.
    """
    mesh = _local_mesh(mesh, pipe_axis)
    device = mesh.devices.flat[0]
    prof = _measure.profile_kernels(ks, graph, param_avals, device,
                                    cache=self.cache, repeats=self.repeats,
                                    memo=self._memo, part=part, stage=stage,
                                    estimator=self.estimator)
    self._spent += prof.profile_seconds
    self._measured += prof.measured
    self._hit = self._hit and prof.cache_hit
    link = self.link_model(mesh, pipe_axis)
    delays = {e: link.seconds(n) for e, n in prof.edge_bytes.items()}
    seconds = prof.seconds()
    shared = work = par = None
    if device.platform == "cpu":
      # The devices of one process share its cores, each device running its
      # part of the program on one thread (kernels are timed on one core):
      # with more devices than cores a busy device gets cores / devices of
      # one. (A device computing while the others idle outside a collective
      # ran up to ~1.4x faster in the program on 2 cores; not modelled.)
      # A stage of g GSPMD devices (timed together on one core) can use g
      # cores; the cores of one pipeline are the process's divided among
      # the data-parallel replicas.
      total = len(mesh.devices.flat)
      pipe = int(dict(mesh.shape)[pipe_axis])
      g = stage.num_devices if stage is not None else 1
      shared = _call_timing.cpu_cores() * pipe * g / total
      work = {b: k.core_seconds for b, k in prof.kernels.items()}
      par = {b: float(g) for b in prof.kernels}
      seconds = {b: work[b] / min(par[b], shared / pipe) for b in work}
    order = sorted(seconds)
    agreed = agree([seconds[b] for b in order] +
                    [delays[e] for e in sorted(delays)])
    seconds = dict(zip(order, agreed[:len(order)]))
    delays = dict(zip(sorted(delays), agreed[len(order):]))
    q = _quantize.quantize(graph, seconds,
                           block_memory_bytes(graph, ks, prof), delays,
                           resolution=self.time_resolution)
    ws = [0] * graph.num_devices
    for k in prof.kernels.values():
      for d in k.devices:
        ws[d] = max(ws[d], k.temp_bytes)
    return SearchCosts(graph=q.graph, memory_unit=q.memory_unit, quantized=q,
                       profile=prof, link=link,
                       workspace_bytes=max(ws, default=0),
                       workspace_per_device=tuple(ws), shared_cores=shared,
                       work=work, parallelism=par,
                       stage_devices=(stage.num_devices if stage is not None
                                      else 1))

  # --- report -----------------------------------------------------------------

  def _mesh_fields(self, mesh: Any, pipe_axis: str) -> dict[str, Any]:
    """What a per-tick measurement on ``mesh`` depends on (cache key;
    ``processes.mesh_fields``)."""
    return _processes.mesh_fields(mesh, pipe_axis)

  def tick_costs(self, mesh: Any, pipe_axis: str) -> _ticks.TickCosts:
    """Per-tick costs of the lowering on this mesh (microbenchmark, cached;
    measured once per CostModel)."""
    if self._ticks is None:
      mesh = _local_mesh(mesh, pipe_axis)
      fields = self._mesh_fields(mesh, pipe_axis)
      t0, hits = time.perf_counter(), self.cache.hits
      self._ticks = _ticks.cached_tick_costs(mesh, pipe_axis, self.cache,
                                             fields)
      self._spent += time.perf_counter() - t0   # part of profiling
      self._hit = self._hit and self.cache.hits > hits
    return self._ticks

  def _standin_seconds(self, plan: Any, mesh: Any, pipe_axis: str
                       ) -> float | None:
    """Step seconds of ``plan``'s stand-in program (memo, disk cache);
    None (logged) where it cannot be built or run."""
    fields = self._mesh_fields(_local_mesh(mesh, pipe_axis), pipe_axis)
    fields["mesh"] = {str(a): int(n) for a, n in dict(mesh.shape).items()}
    memo_key = _cache.make_key({"plan": _calibrate.plan_signature(plan),
                                **fields})
    if memo_key not in self._standin:
      t0 = time.perf_counter()
      try:
        sec, hit = _calibrate.cached_standin_seconds(
            plan, self.time_program, self.cache, fields)
      except Exception as err:  # pylint: disable=broad-except
        # The prediction stays usable without it (the microbenchmark's
        # tick model); say why, once per plan.
        _LOG.warning("tessel_jax: the stand-in program of plan %s could not"
                     " be timed (%s: %s); the prediction uses the tick"
                     " microbenchmark only", plan.loop_summary(),
                     type(err).__name__, err)
        self._standin[memo_key] = None
        return None
      self._spent += time.perf_counter() - t0
      self._hit = self._hit and hit
      self._standin[memo_key] = agree([sec])[0]
    return self._standin[memo_key]

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
    if self._per_port is not None:
      return self._per_port
    got = _port_pricing.port_seconds(self, costs, unrolled, plan, mesh,
                                     pipe_axis, tick_costs)
    if got.spent_s is not None:
      self._spent += got.spent_s
    if got.measured:
      self._hit = False
    if got.final:
      self._per_port = (got.per_port_s, got.tick_ports)
    return got.per_port_s, got.tick_ports

  def _replay(self, costs: SearchCosts, unrolled: Any,
              tick_model: _ticks.TickModel, idle: bool = False
              ) -> _predict.Prediction:
    """Replays ``unrolled`` with the measured kernels (``idle``: with
    zero-time kernels) and ``tick_model``'s costs."""
    q = costs.quantized
    kw = dict(delays=tick_model.delays(q.delay_seconds),
              memory_bytes=q.memory_bytes, barriers=tick_model.barriers,
              tick_seconds=tick_model.tick_seconds,
              barriers_after=tick_model.barriers_after)
    if costs.shared_cores is not None:
      work = ({b: 0.0 for b in costs.work} if idle else costs.work)
      return _predict.predict_shared(unrolled, work, costs.parallelism,
                                     costs.shared_cores, **kw)
    seconds = {b: 0.0 for b in q.seconds} if idle else dict(q.seconds)
    return _predict.predict(unrolled, seconds, **kw)

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
    tick_model = self._tick_model(costs, unrolled, plan, mesh, pipe_axis)
    self.bound_last = False
    self.extra_last_s = 0.0
    calibrate = (self.calibrated and self.time_program is not None
                 and _single_process())
    if calibrate and self.standin_bounds(costs, unrolled, plan, mesh,
                                         pipe_axis, tick_model):
      self.bound_last = True
      self.standins_skipped += 1
      return self._replay(costs, unrolled, tick_model), tick_model
    standin = (self._standin_seconds(plan, mesh, pipe_axis) if calibrate
               else None)
    if standin is not None:
      # The stand-in's step holds the serial part (packing, unpacking,
      # FSDP collectives), which step_seconds adds itself.
      ticks_s = standin - sum(self.serial_seconds(costs, plan, plan.layout,
                                                  mesh, pipe_axis))
      calls = _ticks.kernel_calls(plan)
      extra = _calibrate.extra_tick_seconds(
          ticks_s, lambda x: self._replay(costs, unrolled,
                                          tick_model.plus_calls(x, calls),
                                          idle=True).step_seconds)
      tick_model = tick_model.plus_calls(extra, calls)
      self.extra_last_s = extra
    return self._replay(costs, unrolled, tick_model), tick_model

  def _tick_model(self, costs: SearchCosts, unrolled: Any, plan: Any,
                  mesh: Any, pipe_axis: str) -> _ticks.TickModel:
    """The microbenchmark's tick model of ``plan`` (per-port seconds
    included unless ``cost="calibrated"``), before any stand-in."""
    device = mesh.devices.flat[0]
    rendezvous = device.platform in _ticks.RENDEZVOUS_BACKENDS
    tick_costs = self.tick_costs(mesh, pipe_axis)
    if costs.shared_cores is not None and costs.stage_devices > 1:
      # CPU: the ticks' core-seconds are one device's; a pipe device of
      # the replay is a stage of ``stage_devices`` devices, each paying them.
      g = costs.stage_devices
      tick_costs = dataclasses.replace(
          tick_costs, fixed_s=g * tick_costs.fixed_s,
          per_byte_s=g * tick_costs.per_byte_s)
    if not self.calibrated:  # else the plan's own stand-in prices ticks
      tick_costs = _port_pricing.priced(tick_costs, *self.port_seconds(
          costs, unrolled, plan, mesh, pipe_axis, tick_costs))
    return _ticks.tick_model(plan, costs.link, tick_costs,
                             rendezvous=rendezvous)

  def replay_like(self, costs: SearchCosts, unrolled: Any, plan: Any,
                  mesh: Any, pipe_axis: str, extra_s: float) -> float:
    """Seconds of ``unrolled`` lowered as ``plan``, its ticks priced by the
    tick model plus ``extra_s`` per kernel call (another plan's stand-in
    figure, ``extra_last_s``) without timing a stand-in of its own: a classic
    schedule priced on a searched plan's build (``plan_pricing``) then
    pays for its own ticks, rendezvous and held rounds."""
    model = self._tick_model(costs, unrolled, plan, mesh, pipe_axis)
    return self._replay(costs, unrolled, model.plus_calls(
        extra_s, _ticks.kernel_calls(plan))).step_seconds

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
    if self.standin_ceiling_s is None:
      return False
    fields = self._mesh_fields(_local_mesh(mesh, pipe_axis), pipe_axis)
    fields["mesh"] = {str(a): int(n) for a, n in dict(mesh.shape).items()}
    memo_key = _cache.make_key({"plan": _calibrate.plan_signature(plan),
                                **fields})
    if memo_key in self._standin or _calibrate.standin_cached(
        plan, self.cache, fields):
      return False
    bare = self._replay(costs, unrolled, tick_model).step_seconds
    return bare >= self.standin_ceiling_s

  def outside_seconds(self, layout: Any, mesh: Any, pipe_axis: str
                      ) -> float:
    """Seconds of the step's packing and unpacking around its ticks
    (``cost.outside``: measured once per program shape and machine,
    cached); 0 where the build gives no timer (screening builds,
    multi-process runs)."""
    if self.time_outside is None or not _single_process():
      return 0.0
    try:
      got = self.time_outside(layout)
      if got is None:
        return 0.0
      signature, measure = got
      fields = self._mesh_fields(_local_mesh(mesh, pipe_axis), pipe_axis)
      memo_key = _cache.make_key({"program": signature, **fields})
      if memo_key in self._outside:
        return self._outside[memo_key]
      t0 = time.perf_counter()
      sec, hit = _outside.cached_outside_seconds(self.cache, fields,
                                                 signature, measure)
    except Exception as err:  # pylint: disable=broad-except
      # The prediction stays usable without it; say why.
      _LOG.warning("tessel_jax: the packing and unpacking around the ticks"
                   " could not be timed (%s: %s); the prediction leaves"
                   " them out", type(err).__name__, err)
      return 0.0
    if not hit:
      self._spent += time.perf_counter() - t0
      self._hit = False
    self._outside[memo_key] = sec
    return sec

  def fsdp_link(self, costs: SearchCosts, layout: Any, mesh: Any,
                pipe_axis: str) -> _link.LinkModel:
    """The link pricing ``layout``'s FSDP collectives: measured over its
    data axes (``link.measure_gather_link``, cached per machine) in a
    measured single-process build with a timer, else the search's link
    model."""
    axes = tuple(sorted({a for c in layout.classes if c.fsdp
                         for t in c.fsdp for a in t}))
    if (not axes or self.time_outside is None or not _single_process()
        or isinstance(self.link_option, _link.LinkModel)):
      return costs.link
    fields = self._mesh_fields(mesh, pipe_axis)
    key = _cache.make_key({"what": "gatherlink", "data_axes": list(axes),
                           "version": _link.LINK_VERSION,
                           **fields,
                           "mesh": {str(a): int(n) for a, n in
                                    dict(mesh.shape).items()}})
    if key not in self._gather_links:
      rec = self.cache.get("link", key)
      if rec is None:
        t0 = time.perf_counter()
        try:
          model = _link.measure_gather_link(mesh, pipe_axis, axes)
        except Exception as err:  # pylint: disable=broad-except
          _LOG.warning("tessel_jax: FSDP collectives could not be timed"
                       " (%s: %s); priced by the link model",
                       type(err).__name__, err)
          model = costs.link
        else:
          self.cache.put("link", key, model.to_dict())
          self._spent += time.perf_counter() - t0
          self._hit = False
      else:
        model = _link.LinkModel(rec["latency_s"],
                                rec["bandwidth_bytes_per_s"], "measured")
      self._gather_links[key] = model
    return self._gather_links[key]

  def serial_seconds(self, costs: SearchCosts, plan: Any, layout: Any,
                     mesh: Any, pipe_axis: str) -> tuple[float, float]:
    """``(FSDP, outside)`` seconds of the step run serially with its
    ticks: the FSDP all-gathers and reduce-scatters of ``plan`` on
    ``layout`` (``passes.fsdp_comm``, priced by :meth:`fsdp_link`), and
    the packing and unpacking around the ticks (:meth:`outside_seconds`)."""
    link = self.fsdp_link(costs, layout, mesh, pipe_axis)
    return (_fsdp_comm.seconds(layout, plan, link),
            self.outside_seconds(layout, mesh, pipe_axis))

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
    device = mesh.devices.flat[0]
    fixed = list(layout.fixed_bytes_per_device(self.optimizer_slots))
    if costs is not None:
      pred, tick_model = self.predict(costs, unrolled, plan, mesh, pipe_axis)
    spent, measured, hit = self._spent, self._measured, self._hit
    self._spent, self._measured, self._hit = 0.0, 0, True
    if costs is None:
      stash = tuple(p * unit for p in unrolled.peak_memory)
      stats = simulate.simulate(unrolled)
      return CostReport(
          cost="uniform", predicted_step_ms=None,
          peak_memory_bytes=tuple(f + s for f, s in zip(fixed, stash)),
          stash_peak_bytes=stash, bubble_ratio=stats.bubble_ratio,
          quantization_error=None, block_error=None, time_resolution_s=None,
          memory_unit_bytes=unit, memory_limit_bytes=stash_limit_bytes,
          profile_seconds=0.0, cache_hit=False, kernels_measured=0,
          ticks=len(plan.ticks), backend=device.platform)
    q = costs.quantized
    seconds = dict(q.seconds)
    # FSDP gathers and reduce-scatters, packing and unpacking, serial with
    # the ticks (as step_seconds prices every plan compared).
    fsdp_s, outside_s = self.serial_seconds(costs, plan, layout, mesh,
                                            pipe_axis)
    step_s = pred.step_seconds + fsdp_s + outside_s
    searched_here = schedule_costs in (None, "measured")
    qerr = None
    if searched_here:
      real = _predict.makespan_seconds(unrolled, seconds, q.delay_seconds)
      qerr = _quantize.plan_error(unrolled.makespan, q.resolution, real)
    labels = {b.id: b.label for b in q.graph.blocks}
    peak = tuple(f + s + w for f, s, w in zip(
        fixed, pred.peak_bytes, costs.workspace_per_device))
    return CostReport(
        cost=self.cost, predicted_step_ms=step_s * 1e3,
        peak_memory_bytes=peak, stash_peak_bytes=pred.peak_bytes,
        bubble_ratio=pred.bubble_ratio,
        quantization_error=qerr,
        block_error=q.time_error, time_resolution_s=q.resolution,
        memory_unit_bytes=unit, memory_limit_bytes=stash_limit_bytes,
        profile_seconds=spent, cache_hit=hit and measured == 0,
        kernels_measured=measured,
        block_ms={labels[b]: t * 1e3 for b, t in seconds.items()},
        edge_delay_ms={f"{labels[s]}->{labels[d]}": t * 1e3
                       for (s, d), t in q.delay_seconds.items() if t > 0},
        tick_overhead_ms=tick_model.mean_tick_seconds * 1e3,
        barrier_ms=tick_model.barrier_seconds * 1e3,
        fsdp_collective_ms=fsdp_s * 1e3, outside_ms=outside_s * 1e3,
        ticks=len(plan.ticks), link=costs.link.to_dict(),
        backend=device.platform, schedule_costs=schedule_costs or "measured",
        alternative_ms=alternative_ms)
