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
gradients (``passes.fsdp_tick``: hooks in ``_compute``,
``_compute_interp``, ``_straight``, ``_params`` and ``_accumulate``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.sharding import PartitionSpec as P

from . import flushes as _flushes
from . import fsdp as _fsdp
from . import fsdp_tick as _fsdp_tick
from . import gather as _gather
from . import kernel_sends as _kernel_sends
from . import local_writes as _local_writes
from . import outbox as _outbox
from . import outputs as _outputs
from . import pack_local as _pack_local
from . import predicated as _predicated
from . import stash_order as _stash_order
from .kernels import KernelSet
from .packing import Layout, read_region, unpack_grads
from .partition import Partition
from .plan import Dyn, Plan, Tick

_NO_MOD = 1 << 30
# ``pbuf`` key of the parameter leaves read in place (``inplace_params``).
_INPLACE = ("inplace",)

# Name scopes of the program's parts: they reach the HLO's op_name metadata,
# where ``experiments.step_profile`` reads them to split a profiled step.
SCOPES = {"kernel": "tj_kernel", "params": "tj_params",
          "stash_read": "tj_stash_read", "stash_write": "tj_stash_write",
          "send": "tj_send", "ppermute": "tj_ppermute",
          "accumulate": "tj_accumulate", "terminals": "tj_terminals"}
# Scopes of the segment kinds (``passes.segments``) and the prefix of each
# kernel's own scope (``tj_kernel/k<id>``): ``experiments.hlo_breakdown``
# reads them to split the HLO by segment kind and count kernel copies.
SEGMENT_SCOPES = {"ticks": "tj_seg_ticks", "loop": "tj_seg_loop",
                  "interp": "tj_seg_interp"}
KERNEL_PREFIX = "k"


def _scoped(part: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
  """Runs a method under the name scope of ``part`` (see ``SCOPES``)."""
  def wrap(method: Callable[..., Any]) -> Callable[..., Any]:
    def scoped(*args: Any, **kwargs: Any) -> Any:
      with jax.named_scope(SCOPES[part]):
        return method(*args, **kwargs)
    scoped.__doc__, scoped.__name__ = method.__doc__, method.__name__
    return scoped
  return wrap


class _Ctx:
  """Trace-time helpers bound to one device index (and an interp tick)."""

  def __init__(self, dev: Any, tau: Any = None):
    self.dev = dev
    self.tau = tau

  def at(self, tau: Any) -> "_Ctx":
    return _Ctx(self.dev, tau)

  def table(self, values: np.ndarray, dtype: Any = jnp.int32) -> Any:
    """Per-device value: a Python scalar when uniform, else a lookup.

    1-D tables are indexed by device; 2-D (interp) tables by (tick, device).
    """
    values = np.asarray(values)
    if values.ndim == 2 and isinstance(self.tau, (int, np.integer)):
      values = values[int(self.tau)]
    if values.size and np.all(values == values.flat[0]):
      v = values.flat[0]
      return v.item() if hasattr(v, "item") else v
    if values.ndim == 2:
      return jnp.asarray(values, dtype)[self.tau, self.dev]
    return jnp.asarray(values, dtype)[self.dev]

  def dyn(self, d: Dyn, it: Any) -> Any:
    """Evaluates a :class:`Dyn` for iteration ``it`` (int or traced)."""
    if isinstance(it, (int, np.integer)) or d.is_static:
      return self.table(d.at(int(it) if isinstance(it, (int, np.integer))
                             else 0))
    mod = np.where(d.mod > 0, d.mod, _NO_MOD)
    base, scale = self.table(d.base), self.table(d.scale)
    c, m = self.table(d.c), self.table(mod)
    k = it + c
    if not (isinstance(m, int) and m == _NO_MOD):
      k = k % m
    return base + scale * k


_pin = _fsdp.pin  # GSPMD constraint inside the map (passes.fsdp)


def _read_rows(x: Any, start: Any, rows: int) -> Any:
  if isinstance(start, int) and start == 0 and x.shape[0] == rows:
    return x
  return lax.dynamic_slice_in_dim(x, start, rows, axis=0)


def _write(pool: Any, value: Any, slot: Any, row: Any) -> Any:
  if value.shape == pool.shape[1:]:
    return lax.dynamic_update_index_in_dim(pool, value, slot, 0)
  starts = (slot, row) + (0,) * (value.ndim - 1)
  return lax.dynamic_update_slice(pool, value[None], starts)


def _read(pool: Any, slot: Any, row: Any, shape: tuple[int, ...]) -> Any:
  if tuple(shape) == pool.shape[1:]:
    return lax.dynamic_index_in_dim(pool, slot, 0, keepdims=False)
  starts = (slot, row) + (0,) * (len(shape) - 1)
  return lax.dynamic_slice(pool, starts, (1,) + tuple(shape))[0]


class Lowering:
  """Builds the SPMD program of a plan.

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
  """

  def __init__(self, plan: Plan, part: Partition, layout: Layout, mesh: Any,
               pipe_axis: str, data_axes: Sequence[str], train: bool,
               total_microbatches: int):
    self.plan = plan
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

  def _reads_gathered(self, kernel: Any, leaf: int) -> bool:
    """``kernel`` reads ``leaf`` gathered before the first tick."""
    return (leaf in self.layout.gathered and
            len(kernel.devices) < self.num_devices)

  def _collective(self, kernel: Any) -> bool:
    """``kernel`` gathers a sharded leaf at its tick (all devices)."""
    return any(l in self.layout.shards and not self._reads_gathered(kernel, l)
               for l in kernel.params)

  # --- one tick -------------------------------------------------------------

  @_scoped("send")
  def _payload(self, ctx: _Ctx, rd: Any, ports: Sequence[Any]) -> Any:
    """What this device sends in round ``rd`` (before any ``ppermute``)."""
    rows = rd.payload.shape[0] if rd.payload.shape else 0
    vals = []
    for c in rd.candidates:
      v = ports[c]
      if rd.rowed and tuple(v.shape) != rd.payload.shape:
        v = _read_rows(v, ctx.table(rd.src_row), rows)
      vals.append(v)
    if len(vals) == 1:
      return vals[0]
    return lax.select_n(ctx.table(rd.cand), *vals)

  @_scoped("stash_write")
  def _write_targets(self, ctx: _Ctx, rd: Any, payload: Any,
                     pools: list[Any], it: Any,
                     order: _stash_order.Order | None = None) -> None:
    for tg in rd.targets:
      slot = ctx.dyn(tg.slot, it)
      if order is not None:
        slot = order.slot(slot)
      pools[tg.pool] = _write(pools[tg.pool], payload, slot,
                              ctx.table(tg.row))

  def _sends(self, ctx: _Ctx, tick: Tick, ports: Sequence[Any],
             pools: list[Any], it: Any, remote: bool | None = None,
             order: _stash_order.Order | None = None) -> None:
    """Writes the tick's rounds (only the remote or local ones if given)."""
    for rd in tick.sends:
      if remote is not None and rd.remote != remote:
        continue
      payload = self._payload(ctx, rd, ports)
      if rd.remote:
        with jax.named_scope(SCOPES["ppermute"]):
          payload = lax.ppermute(payload, self.pipe, perm=list(rd.perm))
      self._write_targets(ctx, rd, payload, pools, it, order)

  def _read_index(self, ctx: _Ctx, tick: Tick, it: Any) -> list[tuple]:
    """``(slot or row start, row)`` of each read port of the tick."""
    return [(ctx.dyn(rp.index, it),
             ctx.table(rp.row) if rp.kind == "pool" else 0)
            for rp in tick.reads]

  @_scoped("stash_read")
  def _read_port(self, rp: Any, index: tuple, pools: Sequence[Any],
                 batch: Sequence[Any]) -> Any:
    """One read port's value (inside the branch of a kernel reading it)."""
    if rp.kind == "pool":
      return _read(pools[rp.source], index[0], index[1], rp.aval.shape)
    return _read_rows(batch[rp.source], index[0], rp.aval.shape[0])

  @_scoped("params")
  def _params(self, ctx: _Ctx, kernel: Any, pbuf: dict[str, Any],
              slots: Sequence[Sequence[Any]]) -> list[Any]:
    if _INPLACE in pbuf:
      return [pbuf[_INPLACE][l] for l in kernel.params]
    by_leaf: dict[int, Any] = {}
    for l in kernel.params:
      where = self.layout.slot_of.get((l, kernel.devices[0]))
      v = _fsdp_tick.param(self.layout, kernel, l, pbuf)  # ZeRO-3 per block
      if v is not None:
        by_leaf[l] = v
      elif where is not None and not self._reads_gathered(kernel, l):
        c, j = where
        if any(self.layout.slot_of[(l, d)] != where for d in kernel.devices):
          raise AssertionError("a shared block's leaf sits in different slots")
        by_leaf[l] = _pin(slots[c][j][0], self.layout.classes[c].inner_spec)
    for dt in self.layout.dtypes:
      region = self.layout.regions[dt].get(kernel.fwd)
      if region is None or not region.leaves:
        continue
      off = self._region_offset(ctx, kernel, region)
      for l, v in zip(region.leaves,
                      read_region(pbuf[dt], region, self.local_avals, off)):
        by_leaf[l] = v
    out = []
    for l in kernel.params:
      if self._reads_gathered(kernel, l):
        out.append(pbuf[("gathered", l)])
        continue
      v = by_leaf[l]
      if l in self.layout.shards:
        ax, _ = self.layout.shards[l]
        v = lax.all_gather(v, self.pipe, axis=ax, tiled=True)
      out.append(v)
    return out

  def _shard_grad(self, leaf: int, g: Any) -> Any:
    """Sums a full-shaped leaf gradient over the pipe axis, keeps the shard."""
    if leaf not in self.layout.shards:
      return g
    ax, _ = self.layout.shards[leaf]
    return lax.psum_scatter(g, self.pipe, scatter_dimension=ax, tiled=True)

  # --- parameter gradients: accumulated in place, in the branch ------------

  def _acc_keys(self, tick: Tick) -> tuple[tuple, ...]:
    """Keys of the accumulators some kernel of the tick adds to."""
    return tuple(gp.key for gp in tick.grads) if self.train else ()

  def _region_offset(self, ctx: _Ctx, kernel: Any, region: Any) -> Any:
    """The kernel's flat region start: static when its devices agree."""
    offsets = np.array([region.offsets[d] for d in kernel.devices])
    if len(kernel.devices) == 1 or np.all(offsets == offsets[0]):
      return int(offsets[0])
    table = np.array([max(o, 0) for o in region.offsets])
    return jnp.asarray(table, jnp.int32)[ctx.dev]

  @_scoped("accumulate")
  def _accumulate(self, ctx: _Ctx, kernel: Any, gvals: Sequence[Any],
                  accs: dict[tuple, Any]) -> None:
    """Adds one kernel's parameter gradients into ``accs`` (in place).

    Runs inside the kernel's own switch branch, so an accumulator is read
    and written only at the ticks where a block that owns it runs; other
    branches pass it through untouched (no zero-filled gradient outputs, no
    every-port add on every device).
    """
    by_leaf = {}
    for l, g in zip(kernel.grads, gvals):
      if self._reads_gathered(kernel, l):
        key = ("gathered", l)
        accs[key] = accs[key] + g.astype(accs[key].dtype)
      else:
        by_leaf[l] = self._shard_grad(l, g)
    for leaf, g in by_leaf.items():
      where = self.layout.slot_of.get((leaf, kernel.devices[0]))
      if where is not None:
        key = (_fsdp_tick.grad_key(self.layout, kernel, leaf) or
               ("slot",) + tuple(where))
        accs[key] = accs[key] + g.astype(accs[key].dtype)
    for dt in self.layout.dtypes:
      region = self.layout.regions[dt].get(kernel.fwd)
      if region is None or not region.leaves:
        continue
      parts = [jnp.zeros((n,), dt) if by_leaf.get(l) is None
               else jnp.ravel(by_leaf[l]).astype(dt)
               for l, n in zip(region.leaves, region.sizes)]
      g = jnp.concatenate(parts) if len(parts) > 1 else parts[0]
      off = self._region_offset(ctx, kernel, region)
      acc = accs[("flat", dt)]
      cur = lax.dynamic_slice_in_dim(acc, off, region.length)
      accs[("flat", dt)] = lax.dynamic_update_slice_in_dim(acc, cur + g, off,
                                                           0)

  def _branch(self, ctx: _Ctx, tick: Tick, kid: int | None,
              pbuf: dict[str, Any], slots: Sequence[Sequence[Any]],
              keys: Sequence[tuple]) -> Callable[..., Any]:
    """One switch branch: ``(stash, accs) -> (out ports, accs)``; ``stash``
    holds the pools, the batch and every read port's index."""

    def zeros_out() -> list[Any]:
      return [jnp.zeros(a.shape, a.dtype) for a in tick.out_ports]

    if kid is None:
      def idle(vals: Sequence[Any], accs: tuple) -> Any:
        del vals
        return tuple(zeros_out()), accs
      return idle

    def run(vals: dict[str, Any], accs: tuple) -> Any:
      ports = zeros_out()
      acc = dict(zip(keys, accs))
      outs = self._run_kernel(ctx, tick, kid, vals, acc, pbuf, slots)
      for o, v in zip(tick.out_map[kid], outs):
        ports[o] = v.astype(tick.out_ports[o].dtype)
      return tuple(ports), tuple(acc[k] for k in keys)
    return run

  def _run_kernel(self, ctx: _Ctx, tick: Tick, kid: int,
                  vals: dict[str, Any], acc: dict[tuple, Any],
                  pbuf: dict[str, Any], slots: Sequence[Sequence[Any]],
                  salt: Any = None) -> Sequence[Any]:
    """Reads kernel ``kid``'s inputs from ``vals`` (the stash, the batch
    and the read indices), runs it, adds its parameter gradients into
    ``acc`` (in place) and returns its outputs. ``salt`` (a traced zero)
    is added to the read indices so the kernel depends on it."""
    kernel = self.plan.kernels[kid]
    index = vals["index"]
    if salt is not None:
      index = [(ix[0] + salt, ix[1]) for ix in index]
    dvals = [self._read_port(tick.reads[p], index[p], vals["pools"],
                             vals["batch"])
             for p in tick.in_map[kid]]
    pvals = self._params(ctx, kernel, pbuf, slots)
    kctx = {"row_offset": ctx.table(tick.row_offset)}
    with jax.named_scope(SCOPES["kernel"]), \
         jax.named_scope(f"{KERNEL_PREFIX}{kid}"):
      outs, gvals = kernel.fn(kctx, pvals, dvals)
    if kernel.grads:
      self._accumulate(ctx, kernel, gvals, acc)
    return outs

  def _compute_interp(self, ctx: _Ctx, tick: Tick, pools: Sequence[Any],
                      accs: tuple, tacc: Sequence[Any], pbuf: dict[str, Any],
                      slots: Sequence[Sequence[Any]], batch: Sequence[Any],
                      ports: Sequence[Any], order: _stash_order.Order
                      ) -> tuple:
    """An interp tick: every kernel in a 0/1-trip while loop updating its
    out ports and accumulators in place (``passes.predicated``); no switch,
    no pass-through copies, no zero-filled ports."""
    if len(tick.branches) == 1:
      return self._compute(ctx, tick, pools, accs, tacc, 0, pbuf, slots,
                           batch)
    if any(kid is not None and self._collective(self.plan.kernels[kid])
           for kid in tick.branches):
      raise AssertionError(
          f"interp tick at step {tick.step}: a kernel reading a sharded"
          f" parameter would run on only some devices (its collective"
          f" could hang)")
    vals = {"pools": tuple(pools), "batch": tuple(batch),
            "index": self._read_index(ctx, tick, 0)}
    gacc, sacc = dict(accs[0]), [list(g) for g in accs[1]]
    pbuf = _fsdp_tick.before_tick(self, ctx, tick, 0, slots, gacc, sacc,
                                  pbuf)
    accs = (gacc, tuple(tuple(g) for g in sacc))
    accs, ports = _predicated.run_kernels(
        self, ctx, tick,
        lambda kid, acc, salt: self._run_kernel(ctx, tick, kid, vals, acc,
                                                pbuf, slots, salt),
        ports, accs, order)
    gacc, sacc = dict(accs[0]), [list(g) for g in accs[1]]
    _fsdp_tick.after_tick(self, ctx, tick, gacc, sacc, pbuf)
    accs = (gacc, tuple(tuple(g) for g in sacc))
    tacc = self._terminals(ctx, tick, ports, list(tacc), 0)
    return accs, tuple(tacc), tuple(ports)

  def _compute(self, ctx: _Ctx, tick: Tick, pools: Sequence[Any],
               accs: tuple, tacc: Sequence[Any], it: Any,
               pbuf: dict[str, Any], slots: Sequence[Sequence[Any]],
               batch: Sequence[Any]) -> tuple:
    """Reads, runs the tick's kernels (each adding its parameter gradients
    to the accumulators it owns), accumulates terminals; returns the out
    ports."""
    gacc, sacc = dict(accs[0]), [list(g) for g in accs[1]]
    tacc = list(tacc)
    # The stash goes into the switch and each branch reads only its own
    # kernel's inputs (a device reads nothing for the kernels it does not
    # run; in an interp tick, of all the segment's read ports).
    vals = {"pools": tuple(pools), "batch": tuple(batch),
            "index": self._read_index(ctx, tick, it)}
    pbuf = _fsdp_tick.before_tick(self, ctx, tick, it, slots, gacc, sacc,
                                  pbuf)
    keys = _fsdp_tick.tick_keys(self.layout, self.plan.kernels, tick,
                                self._acc_keys(tick))
    acc_in = tuple(gacc[k[1]] if k[0] == "flat" else
                   sacc[k[1]][k[2]] if k[0] == "slot" else gacc[k]
                   for k in keys)
    branches = [self._branch(ctx, tick, kid, pbuf, slots, keys)
                for kid in tick.branches]
    if len(branches) == 1:
      out_ports, acc_out = branches[0](vals, acc_in)
    elif any(kid is not None and self._collective(self.plan.kernels[kid])
             for kid in tick.branches):
      raise AssertionError(
          f"tick at step {tick.step}: a kernel reading a sharded parameter"
          f" would run inside a switch (its collective could hang)")
    else:
      out_ports, acc_out = lax.switch(ctx.table(tick.branch_of), branches,
                                      vals, acc_in)
    for k, v in zip(keys, acc_out):
      if k[0] == "flat":
        gacc[k[1]] = v
      elif k[0] == "slot":
        sacc[k[1]][k[2]] = v
      else:
        gacc[k] = v
    _fsdp_tick.after_tick(self, ctx, tick, gacc, sacc, pbuf)
    sacc = tuple(tuple(g) for g in sacc)
    tacc = self._terminals(ctx, tick, out_ports, tacc, it)
    return (gacc, sacc), tuple(tacc), tuple(out_ports)

  @_scoped("terminals")
  def _terminals(self, ctx: _Ctx, tick: Tick, out_ports: Sequence[Any],
                 tacc: list[Any], it: Any) -> list[Any]:
    """Adds the tick's terminal outputs (loss parts, outputs) into ``tacc``."""
    tacc = list(tacc)
    for ta in tick.terms:
      v = out_ports[ta.port]
      summed = ta.terminal not in self.per_mb
      scale = ta.scale / (self.total_n if summed else 1)
      s = ctx.table(scale.astype(np.float64), jnp.float32)
      mask = ctx.table(ta.mask, jnp.bool_)
      v = v * jnp.asarray(s, v.dtype) if not (isinstance(s, float) and
                                              s == 1.0) else v
      if not (isinstance(mask, (bool, np.bool_)) and mask):
        v = jnp.where(mask, v, jnp.zeros_like(v))
      acc = tacc[ta.terminal]
      row = ctx.table(ta.row)
      if summed:
        if ta.rowed:
          cur = lax.dynamic_slice_in_dim(acc, row, v.shape[0])
          tacc[ta.terminal] = lax.dynamic_update_slice_in_dim(
              acc, cur + v, row, 0)
        else:
          tacc[ta.terminal] = acc + v
      else:
        mb = ctx.dyn(ta.mb, it)
        starts = (mb,) + ((row,) + (0,) * (v.ndim - 1) if v.ndim else ())
        cur = lax.dynamic_slice(acc, starts, (1,) + v.shape)
        tacc[ta.terminal] = lax.dynamic_update_slice(acc, cur + v[None],
                                                     starts)
    return tacc

  def _straight(self, ctx: _Ctx, ticks: Sequence[int], state: tuple, it: Any,
                pbuf: dict[str, Any], slots: Sequence[Sequence[Any]],
                batch: Sequence[Any]) -> tuple:
    """Pruned ticks in order. Local messages are written at the next tick;
    remote rounds are held and written together just before the first tick
    that reads one of them (``passes.flushes``: one rendezvous where the
    schedule needs it, not one per tick); whatever is pending is written at
    the end, so nothing crosses the run's end (write before read)."""
    pools, accs, tacc = state
    pools = list(pools)
    run = list(ticks)
    pbuf = _fsdp_tick.run_scope(self.layout, pbuf, pools)  # gathers per run
    flushes = _flushes.remote_flushes(self.plan.ticks, run)
    held: dict[int, Sequence[Any]] = {}
    # Only a loop body needs the writes ordered after the reads (its
    # carried stash must stay in place); unrolled ticks are left alone.
    order = (_stash_order.Order(ctx.dev)
             if not isinstance(it, (int, np.integer)) else None)
    for i, t in enumerate(run):
      if i:
        self._sends(ctx, self.plan.ticks[run[i - 1]], held[i - 1], pools, it,
                    remote=False, order=order)
      self._flush(ctx, run, flushes[i], held, pools, it, order)
      tick = self.plan.ticks[t]
      accs, tacc, held[i] = self._compute(ctx, tick, pools, accs, tacc, it,
                                          pbuf, slots, batch)
      if order is not None and any(rp.kind == "pool" for rp in tick.reads):
        # One output of the switch is enough: it follows all its reads.
        order.after(held[i][:1])
    if run:
      self._sends(ctx, self.plan.ticks[run[-1]], held[len(run) - 1], pools,
                  it, remote=False, order=order)
      self._flush(ctx, run, flushes[-1], held, pools, it, order)
    accs = _fsdp_tick.end_run(self, ctx, pbuf, accs)  # pending scatters
    return tuple(pools), accs, tacc

  def _flush(self, ctx: _Ctx, run: Sequence[int], positions: Sequence[int],
             held: dict[int, Sequence[Any]], pools: list[Any],
             it: Any, order: _stash_order.Order | None = None) -> None:
    """Writes the held remote rounds of the ticks at ``positions``.

    Rounds of equal payload shape whose senders and receivers are disjoint
    share one ``ppermute`` (``flushes.merge_rounds``): fewer rendezvous,
    and the merged payload depends on every tick it carries, so XLA
    cannot run the rendezvous before the latest of them.
    """
    rounds = [(j, rd) for j in positions for rd in self.plan.ticks[run[j]].sends
              if rd.remote]
    for group in _flushes.merge_rounds([rd for _, rd in rounds]):
      members = [rounds[g] for g in group]
      vals = [self._payload(ctx, rd, held[j]) for j, rd in members]
      if len(vals) == 1:
        payload = vals[0]
      else:
        which = np.zeros(self.plan.num_devices, np.int64)
        for m, (_, rd) in enumerate(members):
          for src, _ in rd.perm:
            which[src] = m
        payload = lax.select_n(ctx.table(which), *vals)
      perm = sorted(pair for _, rd in members for pair in rd.perm)
      with jax.named_scope(SCOPES["ppermute"]):
        payload = lax.ppermute(payload, self.pipe, perm=perm)
      for _, rd in members:
        self._write_targets(ctx, rd, payload, pools, it, order)

  def _interp(self, ctx: _Ctx, seg: Any, state: tuple, pbuf: dict[str, Any],
              slots: Sequence[Sequence[Any]], batch: Sequence[Any]) -> tuple:
    """A table-driven segment: fori_loop over its ticks (passes.interp);
    remote messages held in outboxes until a flush (passes.held)."""
    spec = self.plan.interps[seg.start]
    n = seg.period
    ports0 = tuple(jnp.zeros(a.shape, a.dtype) for a in spec.out_ports)
    sinks = [p.slots for p in self.plan.pools]
    sends = None
    if _kernel_sends.writes_in_kernels(spec, sinks):
      sends = {kid: _kernel_sends.kernel_sends(spec, kid, b, sinks)
               for b, kid in enumerate(spec.branches) if kid is not None}

    def boundary(c: _Ctx, ports: Sequence[Any], pools: list[Any],
                 outbox: Sequence[Any], order: _stash_order.Order) -> Any:
      if sends is None:
        self._sends(c, spec, ports, pools, 0, remote=False, order=order)
      else:
        _local_writes.write_locals(self, c, spec, ports, pools, order, sends)
      return _outbox.hold_and_flush(self, c, spec, ports, pools, outbox,
                                    order, SCOPES["ppermute"])

    def body(tau, carry):
      pools, accs, tacc, ports, outbox, token = carry
      pools = list(pools)
      c = ctx.at(tau)
      # The writes follow the previous tick's kernels (their stash reads);
      # the kernels' in-place loops follow this tick's sends (port reads).
      order = _stash_order.Order(c.dev)
      order.add(token)
      outbox = boundary(c, ports, pools, outbox, order)
      order.after(pools)
      order.after(outbox)
      accs, tacc, ports = self._compute_interp(c, spec, pools, accs, tacc,
                                               pbuf, slots, batch, ports,
                                               order)
      return tuple(pools), accs, tacc, ports, outbox, order.token

    pools, accs, tacc, ports, outbox, _ = lax.fori_loop(
        0, n, body, state + (ports0, _outbox.empty(spec), jnp.int32(0)))
    pools = list(pools)
    boundary(ctx.at(n), ports, pools, outbox, _stash_order.Order(ctx.dev))
    return tuple(pools), accs, tacc

  def _loop(self, ctx: _Ctx, seg: Any, state: tuple, pbuf: dict[str, Any],
            slots: Sequence[Sequence[Any]], batch: Sequence[Any]) -> tuple:
    """A repetend: ``fori_loop`` whose body unrolls one period.

    A one-tick period whose tick adds parameter gradients is unrolled twice
    per iteration (plus one iteration after the loop when the count is
    odd): XLA writes a conditional's outputs to new buffers, so a single
    switch carrying the accumulators from the loop's input to its output
    made it copy every accumulator each tick; two switches in a row write
    back and forth without a copy.
    """
    ticks = range(seg.start, seg.start + seg.period)
    unroll = 1
    if (seg.period == 1 and seg.iterations >= 2 and
        self._acc_keys(self.plan.ticks[seg.start])):
      unroll = 2

    def loop_body(i: Any, st: tuple) -> tuple:
      for u in range(unroll):
        st = self._straight(ctx, ticks, st, i * unroll + u, pbuf, slots,
                            batch)
      return st

    state = lax.fori_loop(0, seg.iterations // unroll, loop_body, state)
    for it in range(seg.iterations - seg.iterations % unroll,
                    seg.iterations):
      state = self._straight(ctx, ticks, state, it, pbuf, slots, batch)
    return state

  # --- the whole program ----------------------------------------------------

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
           leaves: Sequence[Any] | None = None) -> Any:
    """The shard_map body (one device's view); ``leaves``: the parameters
    read in place instead of ``packed`` and ``slots``."""
    plan = self.plan
    ctx = _Ctx(lax.axis_index(self.pipe))
    pbuf: dict[Any, Any] = ({_INPLACE: leaves} if leaves is not None else
                            {dt: packed[dt][0] for dt in self.layout.dtypes})
    zero3 = _fsdp_tick.per_block(self.layout)
    if not zero3:
      slots = self._gather_fsdp(slots)
    for l, shard in zip(self.gathered, shards):
      pbuf[("gathered", l)] = _gather.gather(
          shard, self.layout.shards[l][0], self.layout.gathered[l].owners,
          self.num_devices, self.pipe, ctx.dev)
    pools = tuple(jnp.zeros((p.slots + 1,) + p.aval.shape, p.aval.dtype)
                  for p in plan.pools)
    gacc = ({dt: jnp.zeros((self.layout.size[dt],), dt)
             for dt in self.layout.dtypes} if self.train else {})
    if self.train:
      for l in self.gathered:
        g = self.layout.gathered[l]
        gacc[("gathered", l)] = jnp.zeros(g.shape, g.dtype)
    sacc = (tuple((_fsdp_tick.init_accumulator(c, s[0]),) if c.fsdp and zero3
                  else tuple(_pin(jnp.zeros(c.shape, c.dtype), c.inner_spec)
                             for _ in range(c.count))
                  for c, s in zip(self.layout.classes, slots))
            if self.train else ())
    n = plan.num_microbatches
    tacc = tuple(
        jnp.zeros(((n + 1,) if j in self.per_mb else ()) + tuple(a.shape),
                  a.dtype)
        for j, a in enumerate(self.ks.terminal_avals))
    state = (pools, (gacc, sacc), tacc)
    for seg in plan.segments:
      with jax.named_scope(SEGMENT_SCOPES[seg.kind]):
        if seg.kind == "interp":
          state = self._interp(ctx, seg, state, pbuf, slots, batch)
        elif seg.kind == "loop":
          state = self._loop(ctx, seg, state, pbuf, slots, batch)
        else:
          state = self._straight(ctx, range(seg.start, seg.end), state, 0,
                                 pbuf, slots, batch)
    _, (gacc, sacc), tacc = state
    if self.train:
      grads = {dt: gacc[dt][None] for dt in self.layout.dtypes}
      sgrads = self._slot_grads(sacc, zero3)
      hgrads = tuple(_gather.scatter(
          gacc[("gathered", l)], self.layout.shards[l][0],
          self.layout.gathered[l].owners, self.num_devices, self.pipe,
          ctx.dev) for l in self.gathered)
      terms = tuple(t[:n][None] if j in self.per_mb else t[None]
                    for j, t in enumerate(tacc))
      if self.data_axes:
        grads = {dt: lax.psum(g, self.data_axes) for dt, g in grads.items()}
        sgrads = tuple(g if c.fsdp and zero3 else self._reduce_slot_grads(g, c)
                       for g, c in zip(sgrads, self.layout.classes))
        hgrads = tuple(lax.psum(g, self.data_axes) for g in hgrads)
        terms = tuple(t if j in self.per_mb else lax.psum(t, self.data_axes)
                      for j, t in enumerate(terms))
      return grads, sgrads, hgrads, terms
    return tuple(t[:n][None] for t in tacc)

  # ``tessel_jax.placed`` sets this on its copy: slot gradients leave the
  # map one array per slot, not stacked per class (no stack, no slices).
  per_slot_grads = False

  def _slot_grads(self, sacc: Sequence[Sequence[Any]], zero3: bool = False
                  ) -> tuple:
    """Per class, the slot gradient accumulators stacked ``(1, S,
    *shape)`` (``per_slot_grads``: a tuple of ``(1, *shape)`` per slot;
    ``zero3``: FSDP classes' shard accumulators, reduced)."""
    if zero3:
      return tuple(_fsdp_tick.slot_grads(c, s[0], self.data_axes) if c.fsdp
                   else _pin(jnp.stack(s)[None], (None, None) + c.inner_spec)
                   for s, c in zip(sacc, self.layout.classes))
    if self.per_slot_grads:
      return tuple(tuple(_pin(g[None], (None,) + c.inner_spec) for g in s)
                   for s, c in zip(sacc, self.layout.classes))
    return tuple(_pin(jnp.stack(s)[None], (None, None) + c.inner_spec)
                 for s, c in zip(sacc, self.layout.classes))

  @_scoped("params")
  def _gather_fsdp(self, slots: Sequence[Sequence[Any]]
                   ) -> list[list[Any]]:
    """FSDP slots gathered over their data axes before the first tick."""
    return _fsdp.gather_slots(slots, self.layout.classes)

  def _reduce_slot_grads(self, g: Any, c: Any) -> Any:
    return _fsdp.reduce_slot_grads(g, c, self.data_axes)

  def _slot_spec(self, c: Any, grads: bool = False) -> Any:
    return _fsdp.slot_spec(c, self.pipe, grads)

  def _shard_spec(self, leaf: int) -> Any:
    """The spec handing every device its slice of a sharded leaf."""
    ax, _ = self.layout.shards[leaf]
    return P(*([None] * ax + [self.pipe]))

  def program(self) -> Callable[[Any, Any], Any]:
    """``fn(params, batch)`` -> ``(loss, grads)`` or outputs; to be jitted."""
    part = self.part
    traced = part.traced
    layout = self.layout
    pipe, data = self.pipe, self.data_axes
    batch_spec = P(data) if data else P()
    shard_specs = tuple(self._shard_spec(l) for l in self.gathered)
    in_specs = ({dt: P(pipe) for dt in layout.dtypes},
                [[self._slot_spec(c)] * c.count for c in layout.classes],
                shard_specs,
                tuple(batch_spec for _ in traced.batch_avals))
    per_mb_spec = P(pipe, data) if data else P(pipe)
    term_specs = tuple(per_mb_spec if j in self.per_mb else P(pipe)
                       for j in range(len(self.ks.terminals)))
    if self.train:
      out_specs = ({dt: P(pipe) for dt in layout.dtypes},
                   tuple(self._slot_spec(c, grads=True)
                         for c in layout.classes), shard_specs,
                   term_specs)
    else:
      out_specs = term_specs
    smap = jax.shard_map(self.body, mesh=self.mesh, in_specs=in_specs,
                         out_specs=out_specs,
                         axis_names={pipe, *data},
                         check_vma=False)
    # tessel_jax.placed maps ``body`` itself, on already-placed params.
    self.smap, self.map_specs = smap, (in_specs, out_specs)
    param_avals = traced.param_avals
    outputs = _outputs.Outputs(part, self.per_mb, self.ks.terminal_avals,
                               self.total_n)
    if self.inplace_params:
      inplace = jax.shard_map(
          lambda leaves, b: self.body({}, [], (), b, leaves=leaves),
          mesh=self.mesh, in_specs=(P(), in_specs[3]), out_specs=out_specs,
          axis_names={pipe, *data}, check_vma=False)

      def run_inplace(params: Any, batch: Any) -> Any:
        bufs = inplace(tuple(jax.tree_util.tree_leaves(params)),
                       tuple(jax.tree_util.tree_leaves(batch)))
        return outputs.infer([buf.sum(axis=0) for buf in bufs])
      return run_inplace

    def run(params: Any, batch: Any) -> Any:
      p_leaves = jax.tree_util.tree_leaves(params)
      b_leaves = jax.tree_util.tree_leaves(batch)
      packed, slots = _pack_local.pack(layout, p_leaves, self.mesh, pipe,
                                       data)
      slots = [[_fsdp.place(self.mesh, a, (pipe,) + c.spec) for a in arrays]
               for arrays, c in zip(slots, layout.classes)]
      shards = tuple(p_leaves[l] for l in self.gathered)
      if self.train:
        gpacked, gslots, hgrads, terms = smap(packed, slots, shards,
                                              tuple(b_leaves))
        value = outputs.train([t.sum(axis=0) for t in terms])
        grads = unpack_grads(layout, gpacked, gslots, param_avals)
        for l, g in zip(self.gathered, hgrads):
          grads[l] = grads[l] + g.astype(grads[l].dtype)
        specs = self.leaf_specs
        grads = [g if l in layout.shards else
                 _fsdp.place(self.mesh, g, specs.get(l, ()), replicate=True)
                 for l, g in enumerate(grads)]
        return value, jax.tree_util.tree_unflatten(traced.param_tree, grads)
      bufs = smap(packed, slots, shards, tuple(b_leaves))
      return outputs.infer([buf.sum(axis=0) for buf in bufs])
    return run
