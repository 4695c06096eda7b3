"""A build's :class:`CostReport`, from its cost model's figures.

:func:`build_report` is ``CostModel.report``: the uniform-cost report
(simulated, no measurements) or the measured one (the prediction, the
serial part, the quantisation's errors and the profiling tally).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from tessel_jax import simulate
from tessel_jax.cost import predict as _predict
from tessel_jax.cost import quantize as _quantize
from tessel_jax.cost.report import CostReport

if TYPE_CHECKING:
  from tessel_jax.cost.model import CostModel


def _uniform_report(unrolled: Any, plan: Any, fixed: list[int], unit: int,
                    stash_limit_bytes: int | None,
                    backend: str) -> CostReport:
  """The report of a schedule searched and priced on uniform spans."""
  stash = tuple(p * unit for p in unrolled.peak_memory)
  stats = simulate.simulate(unrolled)
  return CostReport(
      cost="uniform", predicted_step_ms=None,
      peak_memory_bytes=tuple(f + s for f, s in zip(fixed, stash)),
      stash_peak_bytes=stash, bubble_ratio=stats.bubble_ratio,
      quantization_error=None, block_error=None, time_resolution_s=None,
      memory_unit_bytes=unit, memory_limit_bytes=stash_limit_bytes,
      profile_seconds=0.0, cache_hit=False, kernels_measured=0,
      ticks=len(plan.ticks), backend=backend)


def _plan_error(costs: Any, unrolled: Any,
                schedule_costs: str | None) -> Any:
  """The quantisation's error on the plan (None where the schedule was
  searched on other spans than these)."""
  if schedule_costs not in (None, "measured"):
    return None
  q = costs.quantized
  real = _predict.makespan_seconds(unrolled, dict(q.seconds),
                                   q.delay_seconds)
  return _quantize.plan_error(unrolled.makespan, q.resolution, real)


def build_report(model: CostModel, costs: Any, unrolled: Any, plan: Any,
                 layout: Any, unit: int, stash_limit_bytes: int | None,
                 mesh: Any, pipe_axis: str,
                 schedule_costs: str | None = None,
                 alternative_ms: float | None = None) -> CostReport:
  """The build's :class:`CostReport` (resets the profiling tally)."""
  backend = mesh.devices.flat[0].platform
  fixed = list(layout.fixed_bytes_per_device(model.optimizer_slots))
  if costs is not None:
    pred, tick_model = model.predict(costs, unrolled, plan, mesh, pipe_axis)
  spent, measured, hit = model.tally.take()
  if costs is None:
    return _uniform_report(unrolled, plan, fixed, unit, stash_limit_bytes,
                           backend)
  q = costs.quantized
  # FSDP gathers and reduce-scatters, packing and unpacking, serial with
  # the ticks (as step_seconds prices every plan compared).
  fsdp_s, outside_s = model.serial_seconds(costs, plan, layout, mesh,
                                           pipe_axis)
  labels = {b.id: b.label for b in q.graph.blocks}
  peak = tuple(f + s + w for f, s, w in zip(
      fixed, pred.peak_bytes, costs.workspace_per_device))
  return CostReport(
      cost=model.cost,
      predicted_step_ms=(pred.step_seconds + fsdp_s + outside_s) * 1e3,
      peak_memory_bytes=peak, stash_peak_bytes=pred.peak_bytes,
      bubble_ratio=pred.bubble_ratio,
      quantization_error=_plan_error(costs, unrolled, schedule_costs),
      block_error=q.time_error, time_resolution_s=q.resolution,
      memory_unit_bytes=unit, memory_limit_bytes=stash_limit_bytes,
      profile_seconds=spent, cache_hit=hit and measured == 0,
      kernels_measured=measured,
      block_ms={labels[b]: t * 1e3 for b, t in q.seconds.items()},
      edge_delay_ms={f"{labels[s]}->{labels[d]}": t * 1e3
                     for (s, d), t in q.delay_seconds.items() if t > 0},
      tick_overhead_ms=tick_model.mean_tick_seconds * 1e3,
      barrier_ms=tick_model.barrier_seconds * 1e3,
      fsdp_collective_ms=fsdp_s * 1e3, outside_ms=outside_s * 1e3,
      ticks=len(plan.ticks), link=costs.link.to_dict(),
      backend=backend, schedule_costs=schedule_costs or "measured",
      alternative_ms=alternative_ms)
