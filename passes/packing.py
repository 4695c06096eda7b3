"""Parameter layout: each device holds only the parameters of its blocks.

SPMD needs the same array shapes on every device, while the blocks of a
placement use different parameters. Two storage kinds:

* **slots** (default for balanced shapes): all leaves of one shape and dtype
  (a *class*) share ``S`` slot arrays of global shape ``(D, *shape)``;
  device ``d`` keeps its ``j``-th leaf of the class in row ``d`` of slot
  ``j``. A kernel reads a leaf as a whole array (no copy), and gradients
  accumulate into one array per slot with a plain add. Used when at most a
  quarter of the slots would stay empty (a layer stack split evenly), or
  half for leaves of 64 KiB or more (:func:`_slots_pay`).
* **flat**: the other leaves (an embedding used on one device only, odd
  shapes) are raveled into one flat buffer per dtype; forward block ``i``
  owns a contiguous *region* on each of its devices. Reading a leaf slices
  the buffer (a copy), but only the devices of the block hold it.

A leaf used by several blocks on one device is stored once per device in a
slot, once per block in flat regions; its gradient is the sum over every
place that holds it (``passes.pack_arrays.unpack_grads``).

A *sharded* leaf (``shards``: leaf -> (axis, parts), from the user's
``param_sharding``) is stored as one equal slice along ``axis`` per device:
device ``d`` holds slice ``d`` of ``parts`` (its layout shape is the shard's),
so every byte count here is the shard's. Its gradient is assembled by
concatenating the devices' shard gradients along ``axis``.

A *split* leaf (``split``: leaf -> (spec, parts), sharded by the user over
mesh axes left to GSPMD, e.g. a Megatron weight ``P(None, "model")``) is
always stored in slots, whose classes are keyed by shape, dtype and spec:
the slot arrays carry the spec after the pipe axis, so each device holds
``1 / parts`` of every such slot (``SlotClass.device_nbytes``).

An *FSDP* leaf is a split leaf whose spec also names data axes (ZeRO-3,
``SlotClass.fsdp``): each data replica stores its shard; per step
(``Layout.fsdp_mode``) the program gathers the slot over the data axes
before the first tick into a buffer of the leaf over the GSPMD axes only
(``SlotClass.gathered_nbytes``), accumulates a gradient of that size and
reduce-scatters it after the last tick (``passes.lower``); per block it
gathers at the ticks of the blocks reading it and accumulates shard-sized
gradients (``passes.fsdp_tick``), holding gathered only the largest block's
slots (``Layout.fsdp_block_bytes``). Byte counts include the gathered
buffers.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

import jax
import numpy as np


LAYOUTS = ("auto", "slots", "flat")
FSDP_MODES = ("per_block", "per_step")
MAX_EMPTY_SLOTS = 0.25
# Leaves of at least this many bytes go to slots with up to
# ``MAX_EMPTY_LARGE`` of their slots empty (one device of two holding a
# class): in a flat buffer each is copied out at every kernel run, and the
# buffer's accumulator, which grows with them, is copied whole at every
# tick with a gradient (measured, ResNet18 on vshape(2): "auto" with every
# conv weight flat cost 6.3-10x the CPU of slots, see BENCHMARKS.md).
SLOT_LEAF_BYTES = 1 << 16
MAX_EMPTY_LARGE = 0.5


@dataclasses.dataclass(frozen=True)
class Region:
  """Where one forward block's flat parameters of one dtype live.

  Attributes:
    leaves: Parameter leaf indices, in order.
    sizes: Element counts of the leaves.
    offsets: Region start per device (-1 where the block does not run).
  """

  leaves: tuple[int, ...]
  sizes: tuple[int, ...]
  offsets: tuple[int, ...]

  @property
  def length(self) -> int:
    return sum(self.sizes)


@dataclasses.dataclass(frozen=True)
class SlotClass:
  """Slot arrays of one shape and dtype.

  Attributes:
    shape: Leaf shape.
    dtype: Dtype name.
    count: Slots ``S``.
    assign: ``assign[d][j]``: leaf in slot ``j`` on device ``d`` (-1: empty).
    spec: ``PartitionSpec`` entries of the leaves over the GSPMD axes (one
      per dimension; empty: replicated).
    parts: Devices each leaf is split over by ``spec`` (1: replicated).
    fsdp: Per dimension, the data axes ``spec`` names there (empty: not
      FSDP): the slot is stored split over them and gathered per step.
    data_parts: Pieces the data axes cut a leaf into (1: not FSDP).
  """

  shape: tuple[int, ...]
  dtype: str
  count: int
  assign: tuple[tuple[int, ...], ...]
  spec: tuple[Any, ...] = ()
  parts: int = 1
  fsdp: tuple[tuple[str, ...], ...] = ()
  data_parts: int = 1

  @property
  def nbytes(self) -> int:
    return int(np.prod(self.shape, dtype=np.int64)) * np.dtype(self.dtype).itemsize

  @property
  def device_nbytes(self) -> int:
    """Bytes of one slot on one device (the shard of a split leaf)."""
    return self.nbytes // self.parts

  @property
  def gathered_nbytes(self) -> int:
    """Bytes of one slot gathered over the data axes on one device (split
    over the GSPMD axes only); 0 when not FSDP."""
    return self.nbytes * self.data_parts // self.parts if self.fsdp else 0

  @property
  def inner_spec(self) -> tuple[Any, ...]:
    """``spec`` without its data axes: the GSPMD split inside the map."""
    if not self.fsdp:
      return self.spec
    out = []
    for e, taken in zip(self.spec, self.fsdp):
      axes = tuple(a for a in (e if isinstance(e, tuple) else (e,))
                   if a is not None and a not in taken)
      out.append(None if not axes else axes[0] if len(axes) == 1 else axes)
    return tuple(out)

  @property
  def data_spec(self) -> tuple[Any, ...]:
    """Per dimension, the data-axes entry of ``spec`` (None: none): how the
    map takes the stored slot in (after the pipe dimension)."""
    return tuple(None if not t else t[0] if len(t) == 1 else t
                 for t in self.fsdp)


@dataclasses.dataclass(frozen=True)
class Gathered:
  """A sharded leaf read by blocks on a strict subset of the pipe axis.

  Its shards are gathered once per step onto ``owners`` (the devices of those
  blocks) with static ``ppermute``s outside every branch, and its gradient
  is scattered back to the shards at the end (``passes.gather``).

  Attributes:
    owners: Devices that hold the full leaf.
    shape: Full shape.
    dtype: Dtype name.
  """

  owners: tuple[int, ...]
  shape: tuple[int, ...]
  dtype: str

  @property
  def nbytes(self) -> int:
    size = int(np.prod(self.shape, dtype=np.int64))
    return size * np.dtype(self.dtype).itemsize


@dataclasses.dataclass(frozen=True)
class Layout:
  """Packed parameter layout.

  Attributes:
    dtypes: Dtype names of the flat buffers.
    size: Flat buffer length per dtype (max device total + the largest
      region, so a dynamic slice of any region length starting at any
      region offset stays in bounds).
    regions: ``regions[dtype][i]``: flat region of forward block ``i``.
    used: Per dtype, per device: flat elements actually used.
    classes: Slot classes.
    slot_of: ``(leaf, device) -> (class index, slot)``.
    num_devices: Devices on the pipe axis.
    shards: Sharded leaves: leaf -> ``(axis, parts)``; device ``d`` holds
      slice ``d`` of ``parts`` along ``axis`` (``parts`` = devices on the
      pipe axis).
    gathered: Sharded leaves read by blocks on a strict subset of the pipe
      axis: leaf -> :class:`Gathered`. Those blocks read the full leaf
      gathered at the start of the step, not a slot or region.
    fsdp_mode: When FSDP slots are gathered: ``"per_block"`` (at the tick of
      each kernel reading them, gradients reduce-scattered after it;
      ``passes.fsdp_tick``) or ``"per_step"`` (once before the first tick,
      gradients reduce-scattered after the last).
    fsdp_block_bytes: Per device, the largest forward block's FSDP
      parameters gathered over the data axes (what ``"per_block"`` holds
      gathered at a tick, and again as its gradients).
  """

  dtypes: tuple[str, ...]
  size: Mapping[str, int]
  regions: Mapping[str, Mapping[int, Region]]
  used: Mapping[str, tuple[int, ...]]
  classes: tuple[SlotClass, ...]
  slot_of: Mapping[tuple[int, int], tuple[int, int]]
  num_devices: int
  shards: Mapping[int, tuple[int, int]] = dataclasses.field(
      default_factory=dict)
  gathered: Mapping[int, Gathered] = dataclasses.field(default_factory=dict)
  fsdp_mode: str = "per_step"
  fsdp_block_bytes: tuple[int, ...] = ()

  @property
  def has_fsdp(self) -> bool:
    """Some slot class is FSDP (stored split over data axes, gathered for
    the blocks that read it): the one test every caller uses."""
    return any(c.fsdp for c in self.classes)

  @property
  def grads_per_slot(self) -> bool:
    """Training slot gradients leave the program's ``shard_map`` one
    array per slot (no FSDP class), not stacked per class
    (``passes.lower_program``: the stack and the unpack's slices of it
    were two copies of every gradient)."""
    return not self.has_fsdp

  @property
  def fsdp_per_block(self) -> bool:
    """FSDP slots are gathered per block (``fsdp_mode``) and there are
    some."""
    return self.fsdp_mode == "per_block" and self.has_fsdp

  def fsdp_live_bytes(self, d: int) -> int:
    """Gathered FSDP bytes live on device ``d`` at once: every gathered
    slot (per step) or the largest block's (per block)."""
    if self.fsdp_per_block:
      return self.fsdp_block_bytes[d] if self.fsdp_block_bytes else 0
    return sum(c.count * c.gathered_nbytes for c in self.classes)

  def bytes_per_device(self) -> tuple[int, ...]:
    """Parameter bytes each device holds (flat used + every slot array, a
    split leaf's slot at its shard's size, FSDP slots' shards plus their
    buffers gathered over the data axes (all of them per step; per block,
    the largest block's) + gathered leaves: the full leaf, a buffer every
    device of the SPMD program has, plus its shard)."""
    slots = sum(c.count * c.device_nbytes for c in self.classes)
    gathered = sum(g.nbytes + g.nbytes // self.shards[l][1]
                   for l, g in self.gathered.items())
    return tuple(
        slots + gathered + self.fsdp_live_bytes(d) +
        sum(self.used[dt][d] * np.dtype(dt).itemsize for dt in self.dtypes)
        for d in range(self.num_devices))

  def fixed_bytes_per_device(self, optimizer_slots: int) -> tuple[int, ...]:
    """Parameters, their gradient accumulators and ``optimizer_slots``
    parameter-sized optimiser arrays per device: ``(2 + optimizer_slots)``
    times ``bytes_per_device``, except that an FSDP slot holds its shard
    (and the optimiser's slots of the shard) plus the gathered buffer and a
    gradient accumulator of the gathered size; per block, the shards'
    accumulators are shard-sized and only the largest block's parameters
    and gradients are held gathered."""
    k = 2 + int(optimizer_slots)
    shards = sum(c.count * c.device_nbytes for c in self.classes if c.fsdp)
    # k x (shards + live) counts k shards and k live buffers; FSDP needs
    # (1 + slots) shards (+ 1 accumulator per block) and 2 live buffers.
    extra = 1 if self.fsdp_per_block else 0
    return tuple(k * b - (1 - extra) * shards -
                 optimizer_slots * self.fsdp_live_bytes(d)
                 for d, b in enumerate(self.bytes_per_device()))

  def useful_bytes_per_device(self) -> tuple[int, ...]:
    """Bytes of leaves each device actually uses."""
    out = []
    for d in range(self.num_devices):
      n = sum(c.device_nbytes for c in self.classes for leaf in c.assign[d]
              if leaf >= 0)
      n += sum(self.used[dt][d] * np.dtype(dt).itemsize for dt in self.dtypes)
      out.append(n)
    return tuple(out)

  def local_avals(self, param_avals: Sequence[Any]) -> list[Any]:
    """Avals of what one device stores per leaf (the shard when sharded)."""
    out = list(param_avals)
    for l, (ax, parts) in self.shards.items():
      out[l] = jax.ShapeDtypeStruct(
          shard_shape(out[l].shape, ax, parts), out[l].dtype)
    return out

  def is_slot(self, leaf: int) -> bool:
    return any(l == leaf for (l, _) in self.slot_of)


def make_layout(param_avals: Sequence[Any],
                block_params: Mapping[int, Sequence[int]],
                block_devices: Mapping[int, Sequence[int]],
                num_devices: int, mode: str = "auto",
                shards: Mapping[int, tuple[int, int]] | None = None,
                split: Mapping[int, tuple[tuple[Any, ...], int]] | None = None,
                gathered: Mapping[int, Sequence[int]] | None = None,
                data_sizes: Mapping[str, int] | None = None,
                fsdp_mode: str = "per_step") -> Layout:
  """Lays out each forward block's parameters on its devices.

  Steps: the leaves' stored avals (a sharded leaf's shard), the devices
  using each leaf, its slot class (shape, dtype, spec) and the classes that
  go to slots (:func:`_slot_classes`), then the other leaves' flat regions
  per dtype (:func:`_flat_regions`).

  Args:
    param_avals: Flat parameter avals.
    block_params: Forward index -> parameter leaves it reads.
    block_devices: Forward index -> devices it runs on.
    num_devices: Devices on the pipe axis.
    mode: ``"auto"`` (slots for balanced shapes, flat otherwise),
      ``"slots"`` or ``"flat"``.
    shards: Sharded leaves: leaf -> ``(axis, parts)``; each device stores
      only its slice (see the module docstring).
    split: Leaves sharded over GSPMD axes: leaf -> ``(spec entries,
      parts)``; always stored in slots of their own spec.
    gathered: Sharded leaves read by blocks on a strict subset of the pipe
      axis: leaf -> the devices of those blocks (leave them out of
      ``block_params`` for those blocks).
    data_sizes: Data axes -> devices along them; split leaves whose spec
      names one are FSDP slots (see the module docstring).
    fsdp_mode: ``"per_block"`` or ``"per_step"`` (``Layout.fsdp_mode``).

  Raises:
    ValueError: for an unknown ``mode`` or ``fsdp_mode`` or a shard that does
      not divide.
  """
  if mode not in LAYOUTS:
    raise ValueError(f"param layout {mode!r}; use one of {LAYOUTS}")
  if fsdp_mode not in FSDP_MODES:
    raise ValueError(f"fsdp={fsdp_mode!r}; use one of {FSDP_MODES}")
  shards = dict(shards or {})
  full_gathered = {
      l: Gathered(tuple(sorted(devs)), tuple(param_avals[l].shape),
                  np.dtype(param_avals[l].dtype).name)
      for l, devs in (gathered or {}).items()}
  avals = _stored_avals(param_avals, shards)
  users, first_block = _users(block_params, block_devices)
  split = dict(split or {})
  classes, slot_of, slot_leaves = _slot_classes(
      _by_class(avals, users, first_block, split), split, users, first_block,
      num_devices, mode, data_sizes or {})
  dtypes, size, regions, used = _flat_regions(
      avals, block_params, block_devices, slot_leaves, num_devices)
  return Layout(dtypes=dtypes, size=size, regions=regions, used=used,
                classes=tuple(classes), slot_of=slot_of,
                num_devices=num_devices, shards=shards,
                gathered=full_gathered, fsdp_mode=fsdp_mode,
                fsdp_block_bytes=_fsdp_block_bytes(
                    classes, slot_of, block_params, block_devices,
                    num_devices))


def _stored_avals(param_avals: Sequence[Any],
                  shards: Mapping[int, tuple[int, int]]) -> list[Any]:
  """Each leaf's aval as a device stores it: a sharded leaf's shard."""
  avals = list(param_avals)
  for l, (ax, parts) in shards.items():
    avals[l] = jax.ShapeDtypeStruct(
        shard_shape(avals[l].shape, ax, parts), avals[l].dtype)
  return avals


def _users(block_params: Mapping[int, Sequence[int]],
           block_devices: Mapping[int, Sequence[int]]
           ) -> tuple[dict[int, set[int]], dict[int, int]]:
  """Per leaf, the devices of the blocks reading it and the first such
  block (in forward order)."""
  users: dict[int, set[int]] = {}
  first_block: dict[int, int] = {}
  for i in sorted(block_params):
    for l in block_params[i]:
      users.setdefault(l, set()).update(block_devices[i])
      first_block.setdefault(l, i)
  return users, first_block


def _by_class(avals: Sequence[Any], users: Mapping[int, set[int]],
              first_block: Mapping[int, int],
              split: Mapping[int, tuple[tuple[Any, ...], int]]
              ) -> dict[tuple, list[int]]:
  """``(shape, dtype name, spec)`` -> its leaves, in first-block order."""
  by_class: dict[tuple, list[int]] = {}
  for l in sorted(users, key=lambda l: first_block[l]):
    a = avals[l]
    spec = split[l][0] if l in split else ()
    key = (tuple(int(s) for s in a.shape), np.dtype(a.dtype).name, spec)
    by_class.setdefault(key, []).append(l)
  return by_class


def _greedy_slots(leaves: Sequence[int], users: Mapping[int, set[int]],
                  first_block: Mapping[int, int], num_devices: int
                  ) -> tuple[dict[int, int], int]:
  """Leaf -> slot, the same slot on all its devices (leaves on most
  devices first, each in the lowest slot free on all of them); and how
  many device slots are used."""
  order = sorted(leaves, key=lambda l: (-len(users[l]), first_block[l]))
  taken: list[set[int]] = [set() for _ in range(num_devices)]
  place: dict[int, int] = {}
  for l in order:
    j = 0
    while any(j in taken[d] for d in users[l]):
      j += 1
    place[l] = j
    for d in users[l]:
      taken[d].add(j)
  return place, sum(len(t) for t in taken)


def _slot_classes(by_class: Mapping[tuple, list[int]],
                  split: Mapping[int, tuple[tuple[Any, ...], int]],
                  users: Mapping[int, set[int]],
                  first_block: Mapping[int, int], num_devices: int,
                  mode: str, data_sizes: Mapping[str, int]
                  ) -> tuple[list[SlotClass], dict, set[int]]:
  """The classes stored in slots (every split class; in ``"auto"`` the
  ones :func:`_slots_pay` admits; none but split ones in ``"flat"``), the
  ``(leaf, device) -> (class, slot)`` map and the leaves in slots."""
  classes: list[SlotClass] = []
  slot_of: dict[tuple[int, int], tuple[int, int]] = {}
  slot_leaves: set[int] = set()
  for (shape, dt, spec), leaves in by_class.items():
    if mode == "flat" and not spec:
      continue
    place, used_slots = _greedy_slots(leaves, users, first_block,
                                      num_devices)
    count = 1 + max(place.values())
    if mode == "auto" and not spec and not _slots_pay(
        used_slots, count * num_devices, shape, dt):
      continue
    k = len(classes)
    assign = [[-1] * count for _ in range(num_devices)]
    for l, j in place.items():
      for d in users[l]:
        assign[d][j] = l
        slot_of[(l, d)] = (k, j)
    slot_leaves.update(leaves)
    fsdp = tuple(tuple(a for a in (e if isinstance(e, tuple) else (e,))
                       if a in data_sizes) for e in spec)
    classes.append(SlotClass(
        shape=shape, dtype=dt, count=count,
        assign=tuple(tuple(a) for a in assign), spec=spec,
        parts=split[leaves[0]][1] if spec else 1,
        fsdp=fsdp if any(fsdp) else (),
        data_parts=int(np.prod([data_sizes[a] for t in fsdp for a in t]))))
  return classes, slot_of, slot_leaves


def _flat_regions(avals: Sequence[Any],
                  block_params: Mapping[int, Sequence[int]],
                  block_devices: Mapping[int, Sequence[int]],
                  slot_leaves: set[int], num_devices: int
                  ) -> tuple[tuple[str, ...], dict[str, int],
                             dict[str, dict[int, Region]],
                             dict[str, tuple[int, ...]]]:
  """``(dtypes, size, regions, used)`` of the leaves not in slots: per
  dtype, each block's region placed after what its devices hold already;
  a buffer's size leaves room for the longest region past the fullest
  device (``Layout.size``)."""
  flat_params = {i: [l for l in ls if l not in slot_leaves]
                 for i, ls in block_params.items()}
  dtypes = sorted({np.dtype(avals[l].dtype).name
                   for ls in flat_params.values() for l in ls})
  regions: dict[str, dict[int, Region]] = {dt: {} for dt in dtypes}
  used: dict[str, list[int]] = {dt: [0] * num_devices for dt in dtypes}
  for i in sorted(flat_params):
    for dt in dtypes:
      leaves = tuple(l for l in flat_params[i]
                     if np.dtype(avals[l].dtype).name == dt)
      sizes = tuple(int(np.prod(avals[l].shape, dtype=np.int64))
                    for l in leaves)
      offsets = [-1] * num_devices
      for d in block_devices[i]:
        offsets[d] = used[dt][d]
        used[dt][d] += sum(sizes)
      regions[dt][i] = Region(leaves, sizes, tuple(offsets))
  size = {}
  for dt in dtypes:
    longest = max((r.length for r in regions[dt].values()), default=0)
    size[dt] = max(1, max(used[dt]) + longest)
  return (tuple(dtypes), size, regions,
          {dt: tuple(v) for dt, v in used.items()})


def _fsdp_block_bytes(classes: Sequence[SlotClass],
                      slot_of: Mapping[tuple[int, int], tuple[int, int]],
                      block_params: Mapping[int, Sequence[int]],
                      block_devices: Mapping[int, Sequence[int]],
                      num_devices: int) -> tuple[int, ...]:
  """Per device, the largest forward block's FSDP slots gathered over the
  data axes (``Layout.fsdp_block_bytes``)."""
  out = [0] * num_devices
  for i, leaves in block_params.items():
    for d in block_devices[i]:
      n = sum(classes[slot_of[(l, d)][0]].gathered_nbytes
              for l in set(leaves) if (l, d) in slot_of)
      out[d] = max(out[d], n)
  return tuple(out)


def _slots_pay(used: int, total: int, shape: Sequence[int], dtype: str
               ) -> bool:
  """``param_layout="auto"``: a class of leaves of ``shape`` and ``dtype``
  filling ``used`` of its ``total`` slots (over all devices) goes to
  slots: at most ``MAX_EMPTY_SLOTS`` of them empty, or ``MAX_EMPTY_LARGE``
  for leaves of ``SLOT_LEAF_BYTES`` or more (module constants)."""
  nbytes = int(np.prod(shape, dtype=np.int64)) * np.dtype(dtype).itemsize
  empty = 1.0 - used / total
  return empty <= MAX_EMPTY_SLOTS or (
      nbytes >= SLOT_LEAF_BYTES and empty <= MAX_EMPTY_LARGE)


def shard_shape(shape: Sequence[int], axis: int, parts: int
                ) -> tuple[int, ...]:
  """Shape of one of ``parts`` equal slices of ``shape`` along ``axis``."""
  shape = tuple(int(s) for s in shape)
  if shape[axis] % parts:
    raise ValueError(f"dimension {axis} of shape {shape} does not divide into"
                     f" {parts} equal shards")
  return shape[:axis] + (shape[axis] // parts,) + shape[axis + 1:]
