"""The search's cost graph of one kernel set: profile, price, quantise.

:func:`search_costs` profiles the kernels (``measure``), prices the edges
with the cost model's link (``link_choice``) and quantises everything into
the search's integer graph (``quantize``): what
``CostModel.search_graph`` returns.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from tessel_jax.cost import call_timing as _call_timing
from tessel_jax.cost import link as _link
from tessel_jax.cost import measure as _measure
from tessel_jax.cost import processes as _processes
from tessel_jax.cost import quantize as _quantize
from tessel_jax.graph import BlockGraph

if TYPE_CHECKING:
  from tessel_jax.cost.model import CostModel


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


def _cpu_sharing(mesh: Any, pipe_axis: str, stage: Any, prof: Any
                 ) -> tuple[float, dict[int, float], dict[int, float],
                            dict[int, float]]:
  """CPU backend: ``(shared cores, work, parallelism, seconds)``.

  The devices of one process share its cores, each device running its
  part of the program on one thread (kernels are timed on one core): with
  more devices than cores a busy device gets cores / devices of one. (A
  device computing while the others idle outside a collective ran up to
  ~1.4x faster in the program on 2 cores; not modelled.) A stage of g
  GSPMD devices (timed together on one core) can use g cores; the cores of
  one pipeline are the process's divided among the data-parallel replicas.
  """
  pipe = int(dict(mesh.shape)[pipe_axis])
  g = stage.num_devices if stage is not None else 1
  shared = _shared_cores(mesh, pipe_axis, stage)
  work = {b: k.core_seconds for b, k in prof.kernels.items()}
  par = {b: float(g) for b in prof.kernels}
  seconds = {b: work[b] / min(par[b], shared / pipe) for b in work}
  return shared, work, par, seconds


def _agreed(seconds: dict[int, float], delays: dict[Any, float]
            ) -> tuple[dict[int, float], dict[Any, float]]:
  """``seconds`` and ``delays`` as process 0 has them (``agree``)."""
  order = sorted(seconds)
  agreed = _processes.agree([seconds[b] for b in order] +
                            [delays[e] for e in sorted(delays)])
  return (dict(zip(order, agreed[:len(order)])),
          dict(zip(sorted(delays), agreed[len(order):])))


def _workspace(prof: Any, num_devices: int) -> list[int]:
  """Largest kernel workspace (XLA temp bytes) per device."""
  ws = [0] * num_devices
  for k in prof.kernels.values():
    for d in k.devices:
      ws[d] = max(ws[d], k.temp_bytes)
  return ws


#: ``TESSEL_JAX_PARTIAL_BOUND=0``: a caller's ``partial_bound`` is not
#: checked while the kernels are profiled (the path before session 43: a
#: plan is pruned by its bound only after every kernel is compiled and
#: timed).
PARTIAL_BOUND_ENV = "TESSEL_JAX_PARTIAL_BOUND"


def partial_bound_enabled() -> bool:
  """Whether :func:`search_costs` checks a ``partial_bound`` between
  kernels (:data:`PARTIAL_BOUND_ENV`; on by default)."""
  value = os.environ.get(PARTIAL_BOUND_ENV, "1")
  if value not in ("0", "1"):
    raise ValueError(f"{PARTIAL_BOUND_ENV} must be 0 or 1, got {value!r}")
  return value == "1"


@dataclasses.dataclass(frozen=True)
class PartialCosts:
  """What ``plan_pricing.step_lower_bound`` reads of a :class:`SearchCosts`,
  from the kernels profiled so far (the others count 0 s, so a bound on it
  is at most the bound on the whole profile: still a lower bound).

  Attributes:
    graph: The search's block graph (its blocks' devices).
    work: Block id -> seconds (CPU: core-seconds) of the kernels known.
    shared_cores: As :attr:`SearchCosts.shared_cores`.
  """

  graph: BlockGraph
  work: Mapping[int, float]
  shared_cores: float | None = None


def _partial_check(check: Callable[[PartialCosts], None], graph: BlockGraph,
                   shared: float | None
                   ) -> Callable[[Mapping[int, Any]], None]:
  """``profile_kernels``' ``before_measure``: ``check`` on the kernels
  profiled so far (``measure.KernelProfile`` by block id)."""
  def before_measure(known: Mapping[int, Any]) -> None:
    check(PartialCosts(graph=graph,
                       work={b: k.core_seconds for b, k in known.items()},
                       shared_cores=shared))
  return before_measure


def _shared_cores(mesh: Any, pipe_axis: str, stage: Any) -> float | None:
  """``_cpu_sharing``'s shared cores, before any kernel is profiled (None
  off the CPU backend)."""
  if mesh.devices.flat[0].platform != "cpu":
    return None
  total = len(mesh.devices.flat)
  pipe = int(dict(mesh.shape)[pipe_axis])
  g = stage.num_devices if stage is not None else 1
  return _call_timing.cpu_cores() * pipe * g / total


def search_costs(model: CostModel, graph: BlockGraph, ks: Any,
                 param_avals: Any, mesh: Any, pipe_axis: str,
                 part: Any = None, stage: Any = None,
                 hoisted: frozenset[int] = frozenset(),
                 partial_bound: Callable[[PartialCosts], None] | None = None
                 ) -> SearchCosts:
  """Profiles ``ks`` (of partition ``part``; ``hoisted``: block ids of the
  kernels run with their parameter-only values hoisted,
  ``measure.profile_kernels``) and quantises ``graph``
  (``CostModel.search_graph``).

  ``partial_bound`` (the caller's pruning check: it raises to drop the
  plan) is called on the kernels profiled so far (:class:`PartialCosts`)
  before each further kernel is compiled and timed, so a plan its bound
  prunes stops there instead of after its last kernel; not in a
  multi-process run (every process must measure the same kernels) nor
  with ``TESSEL_JAX_PARTIAL_BOUND=0``."""
  mesh = _processes.local_mesh(mesh, pipe_axis)
  device = mesh.devices.flat[0]
  before = None
  if (partial_bound is not None and partial_bound_enabled() and
      _processes.single_process()):
    before = _partial_check(partial_bound, graph,
                            _shared_cores(mesh, pipe_axis, stage))
  prof = _measure.profile_kernels(ks, graph, param_avals, device,
                                  cache=model.cache, repeats=model.repeats,
                                  memo=model.memo.kernels, part=part,
                                  stage=stage, estimator=model.estimator,
                                  hoisted=hoisted, before_measure=before)
  model.tally.add(prof.profile_seconds, hit=prof.cache_hit,
                  measured=prof.measured)
  link = model.link_model(mesh, pipe_axis)
  delays = {e: link.seconds(n) for e, n in prof.edge_bytes.items()}
  seconds = prof.seconds()
  shared = work = par = None
  if device.platform == "cpu":
    shared, work, par, seconds = _cpu_sharing(mesh, pipe_axis, stage, prof)
  seconds, delays = _agreed(seconds, delays)
  q = _quantize.quantize(graph, seconds,
                         block_memory_bytes(graph, ks, prof), delays,
                         resolution=model.time_resolution)
  ws = _workspace(prof, graph.num_devices)
  return SearchCosts(graph=q.graph, memory_unit=q.memory_unit, quantized=q,
                     profile=prof, link=link,
                     workspace_bytes=max(ws, default=0),
                     workspace_per_device=tuple(ws), shared_cores=shared,
                     work=work, parallelism=par,
                     stage_devices=(stage.num_devices if stage is not None
                                    else 1))
