"""What one build of a scheduled step made (``Built``), and the per-block
sharing modes ``step.report`` and ``step.grid`` describe."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

from tessel_jax.graph import BlockGraph
from tessel_jax.schedule import Schedule, UnrolledSchedule


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


def shared_modes(ks: Any) -> list[tuple[str, Any]]:
  """``(F label, BlockMode)`` of every forward block on several devices."""
  modes = getattr(ks, "modes", None) or {}
  return [(f"F{i}", m) for i, m in sorted(modes.items())
          if len(m.devices) > 1]


def block_modes(ks: Any) -> dict[str, str]:
  """``{"F0": "split 4-way" | "replicated: <reason>"}`` for ``step.report``."""
  return {label: m.describe() for label, m in shared_modes(ks)}
