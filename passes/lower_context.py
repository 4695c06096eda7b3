"""What every part of the lowering reads: the plan, the layout, the mesh.

:class:`LowerContext` holds one lowering's inputs and the facts derived from
them that the tick, gradient, segment and program modules
(``passes.tick_io``, ``passes.param_grads``, ``passes.tick_compute``,
``passes.tick_runs``, ``passes.lower_program``) take as their first
argument; ``passes.lower.Lowering`` is one.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from . import grad_windows as _grad_windows
from .kernels import KernelSet
from .packing import Layout
from .partition import Partition
from .plan import Plan
from .switches import Switches


class LowerContext:
  """One lowering's inputs and derived facts.

  Args:
    plan: The tick plan.
    part: The partition (epilogue, avals).
    layout: Parameter layout.
    mesh: Mesh with Auto axes (see ``compat.auto_mesh``).
    pipe_axis: Name of the pipeline axis.
    data_axes: Mesh axes that split the batch (data parallel), in mesh
      order; the axes besides these and the pipe axis are left to GSPMD.
    train: Training or inference.
    total_microbatches: N over all data replicas.
    switches: Optional lowering steps (``passes.switches``; default: the
      library's).
  """

  def __init__(self, plan: Plan, part: Partition, layout: Layout, mesh: Any,
               pipe_axis: str, data_axes: Sequence[str], train: bool,
               total_microbatches: int, switches: Switches = Switches()):
    self.plan = plan
    self.switches = switches
    self.part = part
    self.layout = layout
    self.mesh = mesh
    self.pipe = pipe_axis
    self.data_axes = tuple(data_axes)
    self.train = train
    self.total_n = total_microbatches
    self.ks: KernelSet = plan.kernel_set
    self.param_avals = part.traced.param_avals
    self.local_avals = layout.local_avals(self.param_avals)
    # Terminals kept per micro-batch (buffers ``(n + 1, ...)``): all of them
    # in inference, the ones aux outputs read in training (the rest are
    # summed into the mean the loss needs).
    self.per_mb = frozenset(
        part.aux_terminals if train else range(len(self.ks.terminals)))
    self.num_devices = layout.num_devices
    self.gathered = tuple(sorted(layout.gathered))
    # Forward block -> {leaf: window its gradient can be nonzero in}
    # (``passes.grad_windows``; ``Switches.grad_windows``).
    self.grad_windows = {
        b.index: _grad_windows.block_windows(b) for b in part.blocks
    } if train and switches.grad_windows else {}

  @property
  def inplace_params(self) -> bool:
    """Inference with every leaf whole (no pipe shards, GSPMD splits or
    FSDP): the program already takes the parameters replicated on every
    device, so kernels read them in place and nothing is packed (packing
    copied every parameter into per-device buffers on every call: 60 of
    the 330 CPU ms of a 2-stage GPT inference step)."""
    return (not self.train and not self.layout.shards and
            not self.layout.gathered and
            not any(c.spec for c in self.layout.classes))

  def reads_gathered(self, kernel: Any, leaf: int) -> bool:
    """``kernel`` reads ``leaf`` gathered before the first tick."""
    return (leaf in self.layout.gathered and
            len(kernel.devices) < self.num_devices)

  def collective(self, kernel: Any) -> bool:
    """``kernel`` gathers a sharded leaf at its tick (all devices)."""
    return any(l in self.layout.shards and not self.reads_gathered(kernel, l)
               for l in kernel.params)

  def acc_keys(self, tick: Any) -> tuple[tuple, ...]:
    """Keys of the accumulators some kernel of ``tick`` adds to."""
    return tuple(gp.key for gp in tick.grads) if self.train else ()
