"""Lowering: a tick plan becomes ONE ``jax.jit(jax.shard_map(...))`` program.

Per tick (DESIGN §5): the previous tick's local messages are written into
the stash; remote rounds are held until the first tick that reads one of
them and then written together, rounds of equal payload with disjoint
senders and receivers sharing one ``ppermute`` (``passes.flushes``: on
XLA's CPU runtime each ``ppermute`` is a rendezvous of every device, so as
few as the messages allow, where the schedule needs them); then one
``lax.switch`` over only the kernels present at that tick runs (no switch
where one kernel runs on every device), each branch reading its own
kernel's inputs from the stash (passed in read-only). Parameter gradients are added in place inside the branch of
the kernel that owns them: the tick's accumulators (``Tick.grads``) go into
the switch and the other branches pass them through, so an accumulator is
read and written only on the devices and at the ticks where its block runs
(no zero-filled gradient outputs, no add of every gradient port on every
device). The stash is written before it is read, with
``dynamic_update_slice`` / ``dynamic_slice`` at per-device indices taken
from numpy tables by ``lax.axis_index``. Within a run of ticks, every write
into the stash is made to depend on the outputs of the earlier ticks that
read it (``passes.stash_order``): without that XLA could not order a read
before an unrelated later write and copied the whole stash twice per loop
iteration.

Segments of the plan: straight runs are unrolled; loops become a
``fori_loop`` whose body unrolls one period (the micro-batch of every slot
index is the iteration plus a constant); long ramps become a ``fori_loop``
over ticks whose kernels each run in a 0/1-trip while loop updating their
out ports and accumulators in place (``passes.interp``,
``passes.predicated``: no switch passing every accumulator through). Each
run, loop iteration and ramp ends by writing its last tick's messages, so no
out ports cross a boundary.

No collective runs inside a branch: shared blocks split their rows, and
their partial results are combined by ``ppermute`` and by the final sums.
The one exception is a block on every device of the pipe axis reading a
sharded parameter (``Layout.shards``): at its tick it runs on every device
without a switch, gathers the full leaf with one ``all_gather`` over the
pipe axis before running, and returns the leaf's gradient reduced and
re-sharded with one ``psum_scatter``. Blocks on a strict subset read such a
leaf gathered onto their devices before the first tick and add its
gradient into a full-shaped accumulator scattered back after the last
(``passes.gather``; ``Layout.gathered``).

The ``shard_map`` is manual over the pipe and data axes only; every other
mesh axis is left to GSPMD inside the blocks (tensor parallelism). Slot
classes of leaves split over those axes (``SlotClass.spec``) are pinned to
their spec where the program takes them in, where a kernel reads them and
where their gradients accumulate, so a device holds, reads and updates its
shard only and XLA inserts the tensor-parallel collectives inside the
blocks (every device of a GSPMD group takes the same switch branch, as the
branch depends on the pipe index only). Gradients come back with their
parameters' shardings.

FSDP (ZeRO-3): slot classes of leaves whose spec also names data axes
(``SlotClass.fsdp``) come into the map split over those axes; each is
gathered with one ``all_gather`` over its data axes before the first tick
(every device of a data group runs the same program there, outside every
branch), the kernels read and accumulate the gathered slot as any other,
and after the last tick the accumulated gradient is reduced with one
``psum_scatter`` over the data axes (instead of the ``psum`` of a
replicated leaf), so it leaves the map as the device's shard. That is
``Layout.fsdp_mode == "per_step"``; per block (ZeRO-3) the slots stay split
and each tick gathers what its kernels read and reduce-scatters their
gradients (``passes.fsdp_tick``: hooks in ``tick_compute.compute``,
``tick_compute.compute_interp``, ``tick_runs.straight``,
``tick_io.params`` and ``param_grads.accumulate``).

Modules, one concern each: ``tick_ctx`` (per-device tables, name scopes,
stash slices), ``lower_context`` (the lowering's inputs), ``tick_io`` (a
tick's message writes, port reads and parameter reads), ``param_grads``
(gradient accumulation), ``tick_compute`` (a tick's kernels and
terminals), ``tick_runs`` (straight runs, flushes, loops, interpreted
segments) and ``lower_program`` (the ``shard_map`` body and the program).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from . import fsdp as _fsdp
from . import lower_program as _program
from .lower_context import LowerContext
from .tick_ctx import KERNEL_PREFIX, SCOPES, SEGMENT_SCOPES

__all__ = ["KERNEL_PREFIX", "Lowering", "SCOPES", "SEGMENT_SCOPES"]


class Lowering(LowerContext):
  """Builds the SPMD program of a plan (arguments: :class:`LowerContext`).

  ``program()`` also sets ``smap`` (the ``shard_map`` of :meth:`body`) and
  ``map_specs`` (its ``(in_specs, out_specs)``), which
  ``tessel_jax.placed`` maps on already-placed params.
  """

  # ``tessel_jax.placed`` sets this on its copy: slot gradients leave the
  # map one array per slot, not stacked per class (no stack, no slices).
  per_slot_grads = False

  @property
  def leaf_specs(self) -> dict[int, tuple[Any, ...]]:
    """Leaves split over GSPMD axes -> their spec entries."""
    return _fsdp.leaf_specs(self.layout)

  def out_shardings(self, mesh: Any) -> Any:
    """``jax.jit`` ``out_shardings`` on the user's ``mesh``
    (``passes.fsdp.out_shardings``)."""
    return _fsdp.out_shardings(mesh, self.layout, self.param_avals,
                               self.part.traced.param_tree, self.pipe,
                               self.train)

  def body(self, packed: dict[str, Any], slots: Sequence[Sequence[Any]],
           shards: Sequence[Any], batch: Sequence[Any],
           leaves: Sequence[Any] | None = None,
           workspace: bool = False) -> Any:
    """The shard_map body (``passes.lower_program.body``)."""
    return _program.body(self, packed, slots, shards, batch, leaves,
                         workspace)

  def program(self) -> Callable[[Any, Any], Any]:
    """``fn(params, batch)`` -> ``(loss, grads)`` or outputs; to be jitted."""
    return _program.program(self)

  def _slot_spec(self, c: Any, grads: bool = False) -> Any:
    return _fsdp.slot_spec(c, self.pipe, grads)

  def _shard_spec(self, leaf: int) -> Any:
    """The spec handing every device its slice of a sharded leaf."""
    return _program.shard_spec(self, leaf)
