"""Predicted bytes per device of a lowered training step.

What the compiled step holds per device (``compiled.memory_analysis()``:
argument + output + temp), modelled as the arguments and outputs (the
parameters and their gradients as the user placed them, the batch) plus
the larger of two phases, which XLA's buffer assignment does not hold at
once:

- **the loop**: the packed parameters and their gradient accumulators
  (``2 x Layout.bytes_per_device``; the accumulators leave the map as the
  packed gradients, no third copy), the stash's peak, and, where every
  FSDP slot is gathered at once, every gathered slot and gradient, and
  (per step, loop lowering) the largest slot class's gathered gradients,
  the contiguous input of its reduce-scatter (``_fsdp_extra``);
- **the unpack**: each replicated leaf's gradient is read from the one
  pipe device holding it, so the packed gradients are gathered over the
  pipe axis: up to ``D x`` one device's packed bytes (FSDP slots at their
  shard size; the gathered buffers are dead by then), plus, where plain
  classes are gathered whole (``pack_arrays.gathered_whole``), the sources
  live meanwhile: the device's own packed bytes where slot gradients
  leave the map stacked per class (FSDP layouts), one slot array where
  they leave per slot (``Layout.grads_per_slot``: each slot is gathered
  on its own; measured 1.002x the gathered bytes on a 4-layer MLP on
  ``vshape(4)``, against 1.25x stacked);
- **XLA's tables**: the tuple pointer tables of loop states and scalar
  temps, beside both phases (2.3-2.6 KB measured on the test MLPs;
  :data:`XLA_TABLE_BYTES`).

Per block, a device holds gathered only the block it runs (in an
interpreted tick, inside the kernel's own loop, ``passes.fsdp_kernel``):
``Layout.fsdp_live_bytes``.

Measured against the compiled program (``experiments.tp_bench``,
BENCHMARKS.md "Program bytes"): 1.01-1.09x on the benchmark's rows, none
below the compiled figure; the former sum of every term (three packed
copies, gather and unpack together) was 0.96-1.26x.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import numpy as np

from .pack_arrays import gathered_whole
from .packing import Layout

#: XLA's own temp bytes beside the step's arrays (tuple pointer tables of
#: while-loop states, scalars): 2.3-2.6 KB in the compiled 4-layer MLPs of
#: ``tests/test_program_bytes.py``, with margin.
XLA_TABLE_BYTES = 8 << 10


@dataclasses.dataclass(frozen=True)
class ProgramBytes:
  """Predicted bytes per device of the busiest device.

  Attributes:
    placed: Parameters and their gradients as placed (arguments + outputs).
    batch: The batch argument.
    loop: Packed parameters, accumulators, stash, reduce-scatter input.
    unpack: The packed gradients gathered over the pipe axis.
    stash: The stash's peak (part of ``loop``).
    tables: XLA's tuple tables and scalars (:data:`XLA_TABLE_BYTES`).
  """

  placed: int
  batch: int
  loop: int
  unpack: int
  stash: int
  tables: int = XLA_TABLE_BYTES

  @property
  def total(self) -> int:
    """Arguments and outputs plus the larger phase and XLA's tables."""
    return (self.placed + self.batch + max(self.loop, self.unpack) +
            self.tables)

  def to_dict(self) -> dict[str, int]:
    """Every part and the total, for JSON."""
    out = dataclasses.asdict(self)
    out["total"] = self.total
    return out


def placed_param_bytes(layout: Layout, param_avals: Sequence[Any]) -> int:
  """Bytes of one device's share of the parameters as the user placed
  them (shards of split leaves, whole replicated leaves)."""
  parts = {l: c.parts for c in layout.classes for row in c.assign
           for l in row if l >= 0}
  return sum(int(np.prod(a.shape)) * np.dtype(a.dtype).itemsize
             // parts.get(l, 1) for l, a in enumerate(param_avals))


def all_gathered(layout: Layout, plan: Any) -> bool:
  """Every FSDP slot is gathered at once (per step; per block only the
  running block's, in every lowering). ``plan``: kept for the callers."""
  del plan
  return layout.has_fsdp and not layout.fsdp_per_block


def interpreted_kernels(plan: Any) -> bool:
  """Every kernel of ``plan`` runs in an interpreted tick's own 0/1-trip
  loop (the compact lowering; a one-kernel interp tick runs as a plain
  tick, ``tick_compute.compute_interp``)."""
  return all(seg.kind == "interp" and
             len(plan.interps[seg.start].branches) > 1
             for seg in plan.segments)


def _fsdp_extra(layout: Layout, plan: Any) -> int:
  """FSDP bytes of the loop phase beyond ``2 x`` the device's packed
  bytes (which count the gathered slots or block once).

  Per step, the loop lowering reduce-scatters each class's gathered
  gradients as one contiguous array (the largest class's copy); the
  compact lowering reads the accumulators in place (none; 4-layer MLP on
  (pipe=2, data=2): predicted 1.18x the compiled bytes, with the copy
  1.30x). Per block none: the ``2 x`` counts one block's gathered leaves
  (in the compact lowering the buffers carried across ticks,
  ``fsdp_kernel.CACHE``) and its gathered gradients (a run's pending role
  buffers; a kernel's before their reduce-scatter)."""
  if not all_gathered(layout, plan) or interpreted_kernels(plan):
    return 0
  return max(c.count * c.gathered_nbytes for c in layout.classes if c.fsdp)


def _whole_sources(layout: Layout, packed: int) -> int:
  """Bytes of the gradient sources live while plain classes are gathered
  whole (0: none is): stacked per class, the device's ``packed`` bytes
  (measured: a 4-layer MLP on (pipe=2, model=2) with replicated weights,
  temp 1.25x the gathered bytes; this bound 1.5x); per slot, the largest
  slot array of such a class (each slot gathered on its own)."""
  whole = [c for c in layout.classes if gathered_whole(layout, c)]
  if not whole:
    return 0
  if not layout.grads_per_slot:
    return packed
  return max(c.device_nbytes for c in whole)


def predict(layout: Layout, plan: Any, param_avals: Sequence[Any],
            batch_bytes: int, stash_peak_bytes: int) -> ProgramBytes:
  """Predicted bytes per device of the step (module docstring).

  Args:
    layout: The lowered step's parameter layout.
    plan: Its lowering plan.
    param_avals: Flat parameter avals (as traced, unsharded shapes).
    batch_bytes: Bytes of one device's batch argument.
    stash_peak_bytes: The schedule's largest per-device stash peak.
  """
  per_dev = layout.bytes_per_device()
  d = int(np.argmax(per_dev))
  loop = 2 * per_dev[d] + _fsdp_extra(layout, plan) + int(
      stash_peak_bytes)
  unpack = layout.num_devices * (per_dev[d] - layout.fsdp_live_bytes(d))
  unpack += _whole_sources(layout, per_dev[d])
  placed = 2 * placed_param_bytes(layout, param_avals)
  return ProgramBytes(placed=placed, batch=int(batch_bytes), loop=loop,
                      unpack=unpack, stash=int(stash_peak_bytes))
