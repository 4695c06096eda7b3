"""``CostReport``: what ``step.report`` says about a build, in ms and bytes."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any


@dataclasses.dataclass(frozen=True)
class CostReport:
  """Predicted figures of one build of a scheduled function.

  Attributes:
    cost: ``"measured"``, ``"calibrated"`` (measured, per-tick cost timed on
      the program's stand-in) or ``"uniform"`` (nothing measured: no
      times).
    predicted_step_ms: Predicted wall time of one step in milliseconds
      (None with uniform costs).
    peak_memory_bytes: Per device of the pipe axis: parameters, gradient
      accumulators, optimiser state (``optimizer_slots`` x parameters),
      the schedule's peak stash, the largest kernel workspace and the
      kernels' parameter-only values computed once per step
      (``hoisted_bytes``).
    stash_peak_bytes: Per device, the schedule's peak stash alone.
    bubble_ratio: Idle share of device time in the predicted step (uniform
      costs: of the integer schedule).
    quantization_error: ``|makespan in steps * resolution - makespan with
      the measured durations| / the latter`` for the lowered schedule (None
      with uniform costs).
    block_error: Time-weighted rounding error of the blocks' spans.
    time_resolution_s: Seconds per search step (None: uniform).
    memory_unit_bytes: Bytes per memory unit of the search.
    memory_limit_bytes: Bytes per device left for the stash (None: none).
    profile_seconds: Seconds spent measuring kernels in this build.
    cache_hit: True when every kernel came from the cache (or memory).
    kernels_measured: Distinct kernels timed in this build.
    block_ms: Block label -> measured milliseconds.
    edge_delay_ms: ``"src->dst"`` -> communication milliseconds used as
      the edge's delay.
    tick_overhead_ms: Mean per-tick cost added on every device: the tick
      microbenchmark's, plus what the plan's stand-in program pays beyond
      it (``cost.calibrate``; measured, cached by plan shape).
    barrier_ms: Total all-device synchronisation time in the prediction.
    fsdp_collective_ms: The FSDP all-gathers and reduce-scatters of one
      step (``passes.fsdp_comm``), each priced by ``link``; part of
      ``predicted_step_ms``.
    outside_ms: Packing the parameters before the ticks and unpacking the
      gradients after them (``cost.outside``, measured); part of
      ``predicted_step_ms``.
    ticks: Ticks of the lowered program.
    link: The communication model (``LinkModel.to_dict()``).
    backend: Backend the kernels were measured on.
    schedule_costs: The candidate lowered, by the spans it was searched
      on (``schedule_choice.choose``): ``"measured"``, ``"coarse"`` (the
      measured spans on a coarser grid, ``quantize.coarser``) or
      ``"uniform"`` (the quantisation error is None for these two).
    alternative_ms: Predicted step time of the cheapest other distinct
      candidate; the lowered one's own where every other was in its order
      (the same tick plan); None: no other candidate was found.
    candidate_ms: Every candidate found -> its predicted step time (ms),
      in search order, the lowered one's included; one in the same order
      as an earlier one has that one's (not priced again). Empty: no
      choice was made.
    block_modes: Forward block label (``F0``) of every block on several
      devices -> how it shares a micro-batch: ``"split 4-way"`` or
      ``"replicated: <reason>"`` (``passes.modes``).
    chosen_plan: With ``placement="auto"``: the plan chosen, its predicted
      step and peak, and the runner-up (``plans.AutoChoice.describe``).
    hoisted_bytes: Per device, the kernels' parameter-only values computed
      before the ticks (``passes.hoist``: e.g. reversed conv weights).
    lowering: The lowering of the program and why (``tessel_jax.ramps``):
      e.g. ``"lowering compact (interpret_ramps=0, auto)"``.
  """

  cost: str
  predicted_step_ms: float | None
  peak_memory_bytes: tuple[int, ...]
  stash_peak_bytes: tuple[int, ...]
  bubble_ratio: float
  quantization_error: float | None
  block_error: float | None
  time_resolution_s: float | None
  memory_unit_bytes: int
  memory_limit_bytes: int | None
  profile_seconds: float
  cache_hit: bool
  kernels_measured: int
  block_ms: Mapping[str, float] = dataclasses.field(default_factory=dict)
  edge_delay_ms: Mapping[str, float] = dataclasses.field(default_factory=dict)
  tick_overhead_ms: float = 0.0
  barrier_ms: float = 0.0
  fsdp_collective_ms: float = 0.0
  outside_ms: float = 0.0
  ticks: int = 0
  link: Mapping[str, Any] | None = None
  backend: str = ""
  schedule_costs: str = ""
  alternative_ms: float | None = None
  candidate_ms: Mapping[str, float] = dataclasses.field(default_factory=dict)
  block_modes: Mapping[str, str] = dataclasses.field(default_factory=dict)
  chosen_plan: str = ""
  lowering: str = ""
  hoisted_bytes: int = 0

  def to_dict(self) -> dict[str, Any]:
    out = dataclasses.asdict(self)
    out["peak_memory_bytes"] = list(self.peak_memory_bytes)
    out["stash_peak_bytes"] = list(self.stash_peak_bytes)
    return out

  def summary(self) -> str:
    """One line: predicted time, peak memory, bubbles, profiling."""
    mib = [round(b / 2**20, 2) for b in self.peak_memory_bytes]
    if self.predicted_step_ms is None:
      head = "uniform costs (no prediction)"
    else:
      qe = ("n/a" if self.quantization_error is None else
            f"{100 * self.quantization_error:.1f}%")
      head = (f"predicted step {self.predicted_step_ms:.2f} ms"
              f" (quantisation error {qe}, step"
              f" {1e3 * (self.time_resolution_s or 0):.3f} ms)")
      head += self._choice()
    prof = ("cached" if self.cache_hit else
            f"{self.kernels_measured} kernels in {self.profile_seconds:.2f} s")
    shared = "".join(f"; {label} {how}"
                     for label, how in self.block_modes.items())
    chosen = f"; {self.chosen_plan}" if self.chosen_plan else ""
    lowering = f"; {self.lowering}" if self.lowering else ""
    return (f"{head}; peak memory per device {mib} MiB; bubble ratio"
            f" {self.bubble_ratio:.3f}; profiling {prof}{shared}{chosen}"
            f"{lowering}")

  def _choice(self) -> str:
    """The candidates compared, for :meth:`summary` ("" when none)."""
    if self.candidate_ms:
      each = ", ".join(f"{name} {ms:.2f} ms"
                       for name, ms in self.candidate_ms.items())
      return (f"; schedule searched on {self.schedule_costs} spans of"
              f" candidates predicted {each}")
    if self.alternative_ms is not None:
      return (f"; schedule searched on {self.schedule_costs} spans, another"
              f" predicted {self.alternative_ms:.2f} ms")
    return ""
