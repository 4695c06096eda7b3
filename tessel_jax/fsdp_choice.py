"""``tj.schedule(fsdp="auto")``: when FSDP parameters are gathered.

FSDP parameters (sharded over a data axis) are gathered either once per
step (every slot before the first tick, gradients reduce-scattered after
the last) or per block (ZeRO-3, ``passes.fsdp_tick``: each block gathers
its own slots and reduce-scatters its gradients, in the compact lowering
inside its kernel's loop, ``passes.fsdp_kernel``). Per block holds only
the running block's gathered weights and gradients, but it pays a
collective per block run: at N = 8 it cost 13-20% more CPU than per step
for 3-14% fewer bytes (``experiments.fsdp_compact_bench``, BENCHMARKS.md).

So ``"auto"`` gathers once per step unless the memory limit (given, or
what the device reports) needs per block: the search tries the per-step
layout first, then per block, before any block is made to recompute its
activations (``step_build.search_kernels``). :func:`why` says which and
why for ``step.report.lowering``, with both modes' fixed bytes per device
(``passes.packing.Layout.fixed_bytes_per_device``) and FSDP collectives a
step (``passes.fsdp_comm``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

from tessel_jax import step_schedule

try:  # installed: passes/ is tessel_jax.passes
  from tessel_jax.passes import fsdp_comm as _fsdp_comm  # type: ignore
except ImportError:  # run from the repository root
  from passes import fsdp_comm as _fsdp_comm  # type: ignore

AUTO, PER_BLOCK, PER_STEP = "auto", "per_block", "per_step"
# find(layout) -> (found, fits); raises InfeasibleMemory. ``found`` is
# whatever the caller needs back for that layout (its schedule, ...).
Finder = Callable[[Any], tuple[Any, bool]]


def layouts(option: str, layout: Any) -> tuple[Any, ...]:
  """The layouts the search tries, in order: ``layout`` (made per step
  unless ``fsdp="per_block"``), then with ``"auto"`` and FSDP slots the
  same layout gathered per block."""
  if option != AUTO or not layout.has_fsdp:
    return (layout,)
  return (dataclasses.replace(layout, fsdp_mode=PER_STEP),
          dataclasses.replace(layout, fsdp_mode=PER_BLOCK))


def fits(step: Any, layout: Any, unit: int, unrolled: Any, costs: Any,
         hoisted: int) -> bool:
  """Whether ``unrolled``'s stash peak (memory units of ``unit`` bytes)
  fits what the memory limit leaves beside ``layout``'s fixed bytes (a
  searched schedule always does; a given ``plan`` may not)."""
  limit = step_schedule.memory_units(step, unit, layout, costs, hoisted)
  return limit is None or max(unrolled.peak_memory, default=0) <= limit


def first_fitting(candidates: tuple[Any, ...], find: Finder
                  ) -> tuple[Any, Any]:
  """``(layout, found)`` of the first candidate layout with a schedule
  that fits the memory limit; when a schedule was found but none fits (a
  given ``plan``), the first one found.

  Raises:
    step_schedule.InfeasibleMemory: no candidate has a schedule.
  """
  first, error = None, None
  for layout in candidates:
    try:
      found, ok = find(layout)
    except step_schedule.InfeasibleMemory as err:
      error = err
      continue
    if ok:
      return layout, found
    first = first or (layout, found)
  if first is not None:
    return first
  raise error


def _mib(nbytes: int) -> str:
  return f"{nbytes / 2**20:.2f} MiB"


def _reason(step: Any, layout: Any) -> str:
  """Why ``"auto"`` kept ``layout``'s mode (``first_fitting``'s order:
  per step unless only per block fits)."""
  if layout.fsdp_mode == PER_BLOCK:
    return "only per block fits the memory limit"
  if step_schedule.memory_limit(step) is None:
    return "no memory limit"
  return "per step fits the memory limit"


def _cost(step: Any, layout: Any, plan: Any, mode: str) -> tuple[str, int]:
  """``layout`` gathered ``mode``: its largest fixed bytes per device
  (parameters, gradients, optimiser slots) and FSDP collectives a step of
  ``plan``."""
  as_mode = dataclasses.replace(layout, fsdp_mode=mode)
  fixed = max(as_mode.fixed_bytes_per_device(int(step.optimizer_slots)))
  return _mib(fixed), len(_fsdp_comm.collectives(as_mode, plan))


def why(step: Any, layout: Any, plan: Any) -> str:
  """Why ``layout`` gathers its FSDP parameters as it does, with both
  modes' fixed bytes per device and FSDP collectives a step of ``plan``;
  "" without FSDP slots or with the mode given."""
  if step.fsdp != AUTO or not layout.has_fsdp:
    return ""
  step_mib, step_count = _cost(step, layout, plan, PER_STEP)
  block_mib, block_count = _cost(step, layout, plan, PER_BLOCK)
  return (f"fsdp='auto': {_reason(step, layout)}; per step {step_mib}"
          f" fixed per device and {step_count} FSDP collectives, per block"
          f" {block_mib} and {block_count}")


__all__ = ["AUTO", "PER_BLOCK", "PER_STEP", "first_fitting", "fits",
           "layouts", "why"]
