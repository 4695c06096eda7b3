"""Parameters packed into a :class:`passes.packing.Layout`'s arrays, and
gradients unpacked from them.

``passes.packing`` decides where every leaf is stored (slot classes, flat
regions, shards, FSDP); this module moves arrays in and out of that
storage: :func:`pack` builds the flat buffers and slot arrays from the
leaves, :func:`read_region` reads a leaf back inside a kernel,
:func:`unpack_grads` sums a leaf's gradient over every place that holds it.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from . import indexing as _indexing
from .packing import Layout, Region, SlotClass


def local_leaf(layout: Layout, leaves: Sequence[Any], leaf: int,
               device: int) -> Any:
  """What device ``device`` stores of leaf ``leaf`` (its shard if sharded)."""
  x = leaves[leaf]
  if leaf not in layout.shards:
    return x
  ax, parts = layout.shards[leaf]
  n = x.shape[ax] // parts
  return jax.lax.slice_in_dim(x, device * n, (device + 1) * n, axis=ax)


def pack(layout: Layout, leaves: Sequence[Any]) -> tuple[dict[str, Any],
                                                          list[list[Any]]]:
  """Builds the flat buffers ``(D, size)`` and the slot arrays ``(D, *shape)``.

  Returns:
    ``(flat, slots)``: flat buffers by dtype; ``slots[k][j]`` is slot ``j``
    of class ``k``.
  """
  flat = {}
  for dt in layout.dtypes:
    rows = []
    for d in range(layout.num_devices):
      parts = []
      for i in sorted(layout.regions[dt]):
        region = layout.regions[dt][i]
        if region.offsets[d] < 0:
          continue
        parts.extend(jnp.ravel(local_leaf(layout, leaves, l, d)).astype(dt)
                     for l in region.leaves)
      used = sum(p.size for p in parts)
      parts.append(jnp.zeros((layout.size[dt] - used,), dt))
      rows.append(jnp.concatenate(parts))
    flat[dt] = jnp.stack(rows)
  slots = []
  for c in layout.classes:
    arrays = []
    for j in range(c.count):
      rows = [jnp.asarray(local_leaf(layout, leaves, c.assign[d][j], d),
                          c.dtype)
              if c.assign[d][j] >= 0 else jnp.zeros(c.shape, c.dtype)
              for d in range(layout.num_devices)]
      arrays.append(jnp.stack(rows))
    slots.append(arrays)
  return flat, slots


def flat_pieces(layout: Layout) -> Iterator[tuple[str, int, int, int, int]]:
  """``(dtype, device, leaf, start, size)`` of every leaf piece stored in
  the flat buffers, region by region (forward blocks in order)."""
  for dt in layout.dtypes:
    for i in sorted(layout.regions[dt]):
      region = layout.regions[dt][i]
      for d, off in enumerate(region.offsets):
        if off < 0:
          continue
        pos = off
        for l, n in zip(region.leaves, region.sizes):
          yield dt, d, l, pos, n
          pos += n


def _replicated_classes(layout: Layout, slots: Sequence[Any],
                        mesh: Any) -> list[Any]:
  """Per class, its gradient buffer (or, per slot, each slot's)
  replicated on every device of ``mesh`` (one ``all-gather`` per buffer),
  where that moves only what the outputs need: a plain class (no GSPMD or
  FSDP spec, no pipe-sharded leaf) whose every slot on every device holds
  a distinct leaf. Other classes as they are (empty slots would be moved
  too: on mshape(4) most devices hold few of a class's slots; a leaf held
  on several devices is reduced in place).

  Without it each leaf ``buf[d, j]`` of a buffer split over the pipe axis
  became its own transfer: on ``peer_bench``'s MLP (2 devices, 2 classes
  of 2 slots) 4 ``collective-permute``s, 8 full-size masking selects and
  one all-reduce of every gradient, 81 HLO instructions more than the 2
  ``all-gather``s here.
  """
  rep = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())
  return [jax.tree_util.tree_map(
      lambda b: jax.lax.with_sharding_constraint(b, rep), buf)
          if gathered_whole(layout, c) else buf
          for c, buf in zip(layout.classes, slots)]


def gathered_whole(layout: Layout, c: SlotClass) -> bool:
  """Whether the unpack gathers class ``c``'s gradient buffer whole
  (``_replicated_classes``): a plain class (no GSPMD or FSDP spec, no
  pipe-sharded leaf) whose every slot on every device holds a distinct
  leaf."""
  held = [l for row in c.assign for l in row]
  return (not c.spec and not c.fsdp and min(held) >= 0 and
          len(set(held)) == len(held) and
          not any(l in layout.shards for l in held))


def column_gathered(layout: Layout, c: SlotClass, j: int) -> bool:
  """Whether the unpack gathers slot ``j`` of class ``c`` whole (one
  ``all-gather`` of that slot's column) in a class not gathered whole: a
  plain class whose slot ``j`` holds a distinct leaf on every device (on
  mshape(4) the own block's weight, beside the shared block's slots held
  by every device). Without it each device's leaf became a
  ``collective-permute`` to one device, a masking select and a share of
  one all-reduce of every gradient (``experiments.peer_bench_perf --top``:
  ``xla::cpu::ReduceScatter``)."""
  col = [row[j] for row in c.assign]
  return (not c.spec and not c.fsdp and min(col) >= 0 and
          len(set(col)) == len(col) and
          not any(l in layout.shards for l in col))


def unpack_grads(layout: Layout, flat: Mapping[str, Any],
                 slots: Sequence[Any], param_avals: Sequence[Any],
                 mesh: Any = None) -> list[Any]:
  """Sums every leaf's gradient over all places that hold it.

  Args:
    layout: The layout.
    flat: Flat gradient buffers ``(D, size)`` by dtype.
    slots: Per class, gradient buffers ``(D, S, *shape)``, or a sequence
      of ``S`` buffers ``(D, *shape)`` (one per slot).
    param_avals: Flat parameter avals.
    mesh: The program's mesh, if the buffers are split over it (outside
      the map): plain classes are then gathered whole first
      (``_replicated_classes``).

  Leaves no block reads get zeros. A sharded leaf's gradient is its devices'
  shard gradients (each summed over the places on that device) concatenated
  along the shard axis.
  """
  rep = None
  if mesh is not None:
    slots = _replicated_classes(layout, slots, mesh)
    rep = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())
  grads: list[Any] = [None] * len(param_avals)
  per_dev: dict[tuple[int, int], Any] = {}
  local_avals = layout.local_avals(param_avals)

  def add(l: int, piece: Any, d: int) -> None:
    if l in layout.shards:
      cur = per_dev.get((l, d))
      per_dev[(l, d)] = piece if cur is None else cur + piece
      return
    grads[l] = piece if grads[l] is None else grads[l] + piece

  for dt, d, l, pos, n in flat_pieces(layout):
    piece = jax.lax.slice(flat[dt], (d, pos), (d + 1, pos + n))
    add(l, piece.reshape(local_avals[l].shape), d)
  for c, buf in zip(layout.classes, slots):
    for j in range(c.count):
      # Slot first: ``buf[:, j]`` is a local slice on every device, so one
      # device's row moves that leaf alone, not the device's whole slot
      # array (``buf[d, j]`` did: mshape(4), 8 x 1024^2 MLP, 300 MB moved
      # outside the program per step, now 12 MB; see BENCHMARKS.md).
      col = buf[j] if isinstance(buf, (tuple, list)) else buf[:, j]
      if (rep is not None and not gathered_whole(layout, c) and
          column_gathered(layout, c, j)):
        col = jax.lax.with_sharding_constraint(col, rep)
      held = {c.assign[d][j] for d in range(layout.num_devices)}
      l = min(held)
      if len(held) == 1 and l >= 0 and l not in layout.shards:
        # In slot j on every device (a block on all devices): one
        # reduction over the pipe axis, not a gather from each device.
        add(l, jnp.sum(col, axis=0), 0)
        continue
      for d in range(layout.num_devices):
        if c.assign[d][j] >= 0:
          add(c.assign[d][j], col[d], d)
  for l, (ax, parts) in layout.shards.items():
    pieces = [per_dev.get((l, d)) for d in range(parts)]
    if all(p is None for p in pieces):
      continue
    pieces = [jnp.zeros(local_avals[l].shape, local_avals[l].dtype)
              if p is None else p for p in pieces]
    grads[l] = jnp.concatenate(pieces, axis=ax)
  return [jnp.zeros(a.shape, a.dtype) if g is None else g.astype(a.dtype)
          for g, a in zip(grads, param_avals)]


def read_region(buf: Any, region: Region, param_avals: Sequence[Any],
                offset: Any) -> list[Any]:
  """Leaves of one flat region from a device's local flat buffer.

  Args:
    buf: The device's flat buffer (1-D).
    region: The block's region.
    param_avals: Flat parameter avals as stored (``Layout.local_avals``).
    offset: Region start on this device (int: static slices; traced: a
      dynamic slice of the whole region first).
  """
  if isinstance(offset, (int, np.integer)):
    base, flat = int(offset), buf
  else:
    flat = _indexing.slice_in_dim(buf, offset, max(region.length, 1))
    base = 0
  out = []
  pos = base
  for l, n in zip(region.leaves, region.sizes):
    out.append(jax.lax.slice_in_dim(flat, pos, pos + n).reshape(
        param_avals[l].shape))
    pos += n
  return out
