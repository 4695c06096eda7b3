"""Packing each device's own row only (``pack_arrays.pack`` per device).

``pack_arrays.pack`` builds every slot array as ``jnp.stack`` of one leaf per
pipe device in the global view. With replicated leaves XLA lowers that
stack as one zero-padded full-width copy per device row, summed, and only
then slices each device's row: measured on JAX 0.10.2 (CPU, pipe 4, the
``tp_bench`` GPT), 8 buffers of ``D x`` a weight per device, 32 MiB of the
program's 51 MiB, growing as ``D**2`` slots per class.

Here the packing runs in a ``shard_map`` manual over the pipe and data
axes: each device picks its own leaf of every slot (a ``lax.switch`` on
its pipe index over the distinct leaves of the slot) and concatenates only
its own flat regions, so it allocates one row. Leaves come in as they are
stored: replicated, a pipe-sharded leaf (``Layout.shards``) by its pipe
slice, an FSDP leaf by its data shard; GSPMD axes stay automatic, so a
tensor-parallel leaf keeps its sharding.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
from jax import lax
from jax.sharding import PartitionSpec as P

from . import pack_arrays as _pack_arrays
from .packing import Layout


def _distinct(rows: Sequence[Any]) -> tuple[list[Any], tuple[int, ...]]:
  """``(distinct rows, index of each row among them)`` (by identity)."""
  distinct: list[Any] = []
  index = []
  for r in rows:
    for k, x in enumerate(distinct):
      if x is r:
        index.append(k)
        break
    else:
      index.append(len(distinct))
      distinct.append(r)
  return distinct, tuple(index)


def _pick_all(dev: Any, picks: Sequence[Sequence[Any]]) -> list[Any]:
  """``rows[dev]`` of every ``rows`` in ``picks``, without stacking.

  Picks whose rows repeat in the same pattern over the devices (on
  ``vshape`` every slot: device 0 its first leaf, device 1 its second)
  share one ``lax.switch`` returning all of them: one conditional and one
  branch per distinct row, not one of each per slot (each conditional and
  its branch computations is HLO text, and a conditional of its own).
  """
  out: list[Any] = [None] * len(picks)
  groups: dict[tuple[int, ...], list[tuple[int, list[Any]]]] = {}
  for i, rows in enumerate(picks):
    distinct, index = _distinct(rows)
    if len(distinct) == 1:
      out[i] = distinct[0]
    else:
      groups.setdefault(index, []).append((i, distinct))
  for index, members in groups.items():
    # Each device its own row (vshape): the device index itself, no
    # lookup (a clamped gather of a constant: a kernel of its own).
    which = (dev if index == tuple(range(len(index))) else
             jnp.asarray(index, jnp.int32)[dev])
    branches = [lambda k=k: tuple(d[k] for _, d in members)
                for k in range(max(index) + 1)]
    for (i, _), v in zip(members, lax.switch(which, branches)):
      out[i] = v
  return out


def _leaf_spec(layout: Layout, leaf: int, pipe: str,
               data_spec: dict[int, tuple[Any, ...]]) -> Any:
  """How the packing map takes one leaf in."""
  if leaf in layout.shards:
    ax, _ = layout.shards[leaf]
    return P(*([None] * ax + [pipe]))
  if leaf in data_spec:
    return P(*data_spec[leaf])
  return P()


def _body(layout: Layout, used: Sequence[int], pipe: str) -> Any:
  """The per-device packing function of the map."""
  def body(leaves: Sequence[Any]) -> Any:
    by_leaf = dict(zip(used, leaves))
    dev = lax.axis_index(pipe)
    picks = []
    for dt in layout.dtypes:
      rows = []
      for d in range(layout.num_devices):
        parts = [jnp.ravel(by_leaf[l]).astype(dt)
                 for i in sorted(layout.regions[dt])
                 if layout.regions[dt][i].offsets[d] >= 0
                 for l in layout.regions[dt][i].leaves]
        n = sum(int(p.size) for p in parts)
        parts.append(jnp.zeros((layout.size[dt] - n,), dt))
        rows.append(jnp.concatenate(parts))
      picks.append(rows)
    for c in layout.classes:
      zeros = jnp.zeros(tuple(by_leaf[next(l for row in c.assign for l in row
                                           if l >= 0)].shape), c.dtype)
      picks.extend([by_leaf[c.assign[d][j]].astype(c.dtype)
                    if c.assign[d][j] >= 0 else zeros
                    for d in range(layout.num_devices)]
                   for j in range(c.count))
    # One switch per pattern of distinct rows over the devices.
    picked = iter(_pick_all(dev, picks))
    flat = {dt: next(picked)[None] for dt in layout.dtypes}
    slots = [[next(picked)[None] for _ in range(c.count)]
             for c in layout.classes]
    return flat, slots
  return body


def pack(layout: Layout, leaves: Sequence[Any], mesh: Any, pipe: str,
         data_axes: Sequence[str]) -> tuple[dict[str, Any], list[list[Any]]]:
  """``pack_arrays.pack``'s ``(flat, slots)``, each device building its row.

  Args:
    layout: The layout.
    leaves: Every parameter leaf (global arrays).
    mesh: The program's mesh (all axes Auto).
    pipe: Pipe axis name.
    data_axes: Data axes (manual in the map, as in the program's).

  Returns:
    ``(flat, slots)`` as ``pack_arrays.pack`` gives them: flat buffers
    ``(D, size)`` split over ``pipe``, slot arrays ``(D, *shape)`` split
    over ``pipe`` (FSDP classes also over their data axes).
  """
  data_spec = {l: c.data_spec for c in layout.classes if c.fsdp
               for row in c.assign for l in row if l >= 0}
  used = sorted({l for dt in layout.dtypes
                 for r in layout.regions[dt].values() for l in r.leaves} |
                {l for c in layout.classes for row in c.assign
                 for l in row if l >= 0})
  if not used:
    return _pack_arrays.pack(layout, leaves)
  in_specs = ([_leaf_spec(layout, l, pipe, data_spec) for l in used],)
  out_specs = ({dt: P(pipe) for dt in layout.dtypes},
               [[P(pipe, *c.data_spec) if c.fsdp else P(pipe)] * c.count
                for c in layout.classes])
  smap = jax.shard_map(_body(layout, used, pipe), mesh=mesh,
                       in_specs=in_specs, out_specs=out_specs,
                       axis_names={pipe, *data_axes}, check_vma=False)
  return smap([leaves[l] for l in used])
