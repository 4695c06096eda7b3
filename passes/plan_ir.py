"""Tick plan IR: the static tables the shard_map program is built from.

Frozen dataclasses only (built by ``passes.plan.build_plan``, read by
``passes.lower`` and ``passes.interp``): avals, per-device index tables
(:class:`Dyn`), stash stores and pools, message rounds, read / gradient /
terminal ports, ticks and the whole :class:`Plan`.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from .kernels import Key, Kernel, KernelSet
from .packing import Layout
from .segments import Segment

@dataclasses.dataclass(frozen=True)
class Aval:
  """Hashable shape + dtype."""

  shape: tuple[int, ...]
  dtype: str

  @classmethod
  def of(cls, a: Any) -> "Aval":
    return cls(tuple(int(s) for s in a.shape), _dtype_name(a.dtype))

  def with_rows(self, rows: int) -> "Aval":
    return Aval((rows,) + self.shape[1:], self.dtype)

  @functools.cached_property
  def nbytes(self) -> int:
    """Bytes of one value (made once: a cold placement="auto" choice asks
    ~200k times, pricing ticks)."""
    return math.prod(self.shape) * _itemsize(self.dtype)


# ``np.dtype(x).name`` and ``.itemsize`` by dtype: a cold placement="auto"
# choice asks ~170k and ~300k times (tick plans and tick costs; README GPT:
# ~5% of its CPU in numpy's dtype lookups).
_DTYPE_NAMES: dict[Any, str] = {}
_ITEMSIZES: dict[str, int] = {}


def _dtype_name(dtype: Any) -> str:
  name = _DTYPE_NAMES.get(dtype)
  if name is None:
    name = _DTYPE_NAMES[dtype] = np.dtype(dtype).name
  return name


def _itemsize(name: str) -> int:
  size = _ITEMSIZES.get(name)
  if size is None:
    size = _ITEMSIZES[name] = np.dtype(name).itemsize
  return size


@dataclasses.dataclass(frozen=True, eq=False)
class Dyn:
  """Per-device integer ``base + scale * ((it + c) mod m)`` (m = 0: no mod)."""

  base: np.ndarray
  scale: np.ndarray
  c: np.ndarray
  mod: np.ndarray

  @classmethod
  def const(cls, values: Sequence[int]) -> "Dyn":
    v = np.asarray(values, np.int64)
    z = np.zeros_like(v)
    return cls(v, z, z, z)

  def at(self, it: int) -> np.ndarray:
    k = it + self.c
    k = np.where(self.mod > 0, np.mod(k, np.maximum(self.mod, 1)), k)
    return self.base + self.scale * k

  @property
  def is_static(self) -> bool:
    """True when the value does not depend on the loop iteration."""
    return bool(np.all(self.scale == 0))


@dataclasses.dataclass(frozen=True)
class Store:
  """Where value ``key`` lives on ``device``.

  Attributes:
    key: Value key.
    device: Device.
    rows: ``(r0, r1)`` rows of the micro-batch value held (None: whole).
    aval: Stored shape.
    pool: Pool index.
    base: First slot in the pool on this device.
    slots: Slots used (``K``).
    stride: Slots between micro-batches: micro-batch ``m`` is at
      ``base + stride * (m mod K)`` (a kernel's ``stride`` same-shaped
      outputs of one micro-batch sit side by side, ``passes.stash_groups``).
  """

  key: Key
  device: int
  rows: tuple[int, int] | None
  aval: Aval
  pool: int
  base: int
  slots: int
  stride: int = 1


@dataclasses.dataclass(frozen=True)
class Pool:
  """A stash array: ``slots + 1`` entries of ``aval`` (last one: dummy)."""

  aval: Aval
  slots: int

  @property
  def nbytes(self) -> int:
    return (self.slots + 1) * self.aval.nbytes


@dataclasses.dataclass(frozen=True, eq=False)
class Target:
  """Where a round's payload is written on each device (one pool)."""

  pool: int
  slot: Dyn
  row: np.ndarray


@dataclasses.dataclass(frozen=True, eq=False)
class Round:
  """One ``ppermute`` (remote) or one local write of equal-shaped payloads.

  Attributes:
    remote: True: ``ppermute`` with ``perm``; False: device-local write.
    payload: Payload shape.
    rowed: Payload is a row range of the out port value.
    candidates: Out ports (of the sending tick) the payload comes from.
    cand: Per device: index into ``candidates``.
    src_row: Per device: first row taken from the out port value.
    perm: ``(src, dst)`` pairs (remote only).
    targets: Per destination pool.
    due: Index of the earliest tick reading one of the round's messages:
      the round may be written at any tick boundary up to that tick
      (``passes.flushes``); -1: at the next tick.
    hold: Interp remote rounds only (``passes.held``): per boundary and
      device, the outbox slot the payload is copied to (0: held, 1: sink).
    flush: Interp remote rounds only: per boundary (equal over devices), 1
      where the held messages are sent (``targets`` rows: by that boundary).
  """

  remote: bool
  payload: Aval
  rowed: bool
  candidates: tuple[int, ...]
  cand: np.ndarray
  src_row: np.ndarray
  perm: tuple[tuple[int, int], ...]
  targets: tuple[Target, ...]
  due: int = -1
  hold: np.ndarray | None = None
  flush: np.ndarray | None = None


@dataclasses.dataclass(frozen=True, eq=False)
class ReadPort:
  """One kernel-input port of a tick.

  Attributes:
    kind: ``"pool"`` or ``"batch"``.
    source: Pool index or batch leaf.
    aval: Shape read.
    rowed: Read a row range (else the whole slot).
    index: Per device: slot (pool) or first row in the local batch (batch).
    row: Per device: first row inside the slot (pool reads).
  """

  kind: str
  source: int
  aval: Aval
  rowed: bool
  index: Dyn
  row: np.ndarray


@dataclasses.dataclass(frozen=True)
class GradPort:
  """A parameter-gradient accumulator some kernel of a tick adds to.

  Only the switch branch of the kernel that owns it touches it (in place);
  the other branches pass it through.

  Attributes:
    kind: ``"flat"``: the flat accumulator of dtype ``dtype`` (each kernel
      adds its forward block's region); ``"slot"``: slot ``slot`` of slot
      class ``cls``; ``"gathered"``: the full-shaped gradient of gathered
      leaf ``cls`` (``packing.Gathered``).
    dtype: Dtype name.
    nbytes: Bytes one device adds into it at this tick (at most: the
      largest region or the slot leaf).
    cls: Slot class index (slot accumulators; the leaf for gathered ones;
      -1 for flat).
    slot: Slot index within the class (slot accumulators; -1 for flat).
  """

  kind: str
  dtype: str
  nbytes: int
  cls: int = -1
  slot: int = -1

  @property
  def key(self) -> tuple:
    """``("flat", dtype)``, ``("slot", cls, slot)`` or ``("gathered",
    leaf)``."""
    if self.kind == "flat":
      return ("flat", self.dtype)
    if self.kind == "gathered":
      return ("gathered", self.cls)
    return ("slot", self.cls, self.slot)


@dataclasses.dataclass(frozen=True, eq=False)
class TermAcc:
  """Accumulation of terminal ``terminal`` from out port ``port``.

  Attributes:
    terminal: Terminal index.
    port: Out port holding it.
    mask: Per device: produces it at this tick.
    row: Per device: first row of its part (split producers).
    rowed: The contribution is a row range of the terminal.
    mb: Per device: micro-batch (inference buffers).
    scale: Per device multiplier (``1/g`` for replicated parts).
  """

  terminal: int
  port: int
  mask: np.ndarray
  row: np.ndarray
  rowed: bool
  mb: Dyn
  scale: np.ndarray


@dataclasses.dataclass(frozen=True, eq=False)
class Tick:
  """Static description of one tick."""

  step: int
  kernels: tuple[int | None, ...]
  mb: np.ndarray
  branches: tuple[int | None, ...]
  branch_of: np.ndarray
  reads: tuple[ReadPort, ...]
  in_map: Mapping[int, tuple[int, ...]]
  out_ports: tuple[Aval, ...]
  out_map: Mapping[int, tuple[int, ...]]
  sends: tuple[Round, ...]
  grads: tuple[GradPort, ...]
  grad_map: Mapping[int, Mapping[int, int]]
  terms: tuple[TermAcc, ...]
  row_offset: np.ndarray

  @property
  def signature(self) -> tuple[int | None, ...]:
    return self.kernels


@dataclasses.dataclass(frozen=True, eq=False)
class Plan:
  """Everything the lowering needs, static."""

  num_devices: int
  num_microbatches: int
  ticks: tuple[Tick, ...]
  segments: tuple[Segment, ...]
  pools: tuple[Pool, ...]
  stores: Mapping[tuple[Key, int], Store]
  kernels: Mapping[int, Kernel]
  kernel_set: KernelSet
  layout: Layout
  interps: Mapping[int, Any] = dataclasses.field(default_factory=dict)

  @property
  def stash_bytes(self) -> int:
    """Bytes of all stash pools (the same on every device)."""
    return sum(p.nbytes for p in self.pools)

  def stash_bytes_used(self) -> tuple[int, ...]:
    """Bytes of slots each device actually uses."""
    out = [0] * self.num_devices
    for s in self.stores.values():
      out[s.device] += s.slots * s.aval.nbytes
    return tuple(out)

  def loop_summary(self) -> str:
    parts = []
    for seg in self.segments:
      if seg.is_loop:
        parts.append(f"loop({seg.iterations}x{seg.period})")
      elif seg.kind == "interp":
        parts.append(f"interp({seg.period})")
      else:
        parts.append(f"{seg.period * seg.iterations}")
    return " + ".join(parts)


class PlanError(RuntimeError):
  """The schedule and kernels do not fit together (an internal bug)."""
