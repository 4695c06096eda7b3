"""Per-tick tables shared by the planner and the interpreted ramps.

What ``passes.plan`` (one tick at a time) and ``passes.interp`` (a whole
ramp as one table-driven tick) both need: the row range a device of a
split block holds, read and out ports shared by the kernels of a tick, the
messages a tick's kernels produce, and the gradient accumulators they add
to. Pure Python and numpy; depends only on ``plan_ir``, ``kernels`` and
``packing`` (no import cycle between ``plan`` and ``interp``).
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from .kernels import Key, Kernel
from .packing import Layout
from .plan_ir import Aval, Dyn, GradPort, PlanError, Pool, ReadPort, Store

def rows_of(kernel: Kernel, device: int, b: int) -> tuple[int, int]:
  g = kernel.split
  if g <= 1:
    return (0, b)
  k = kernel.devices.index(device)
  return (k * b // g, (k + 1) * b // g)


def ctx_offset(kernel: Kernel, device: int, b: int) -> int:
  """``ctx["row_offset"]`` of ``kernel`` on ``device``: its first row when
  split, its rank in the block when replicated (0: the leader)."""
  if kernel.mode == "replicated":
    return kernel.devices.index(device)
  return rows_of(kernel, device, b)[0]


def term_counts(kernel: Kernel, output: int, device: int) -> bool:
  """Whether ``device``'s copy of a terminal output of ``kernel`` counts: a
  row range or a partial sum of a split one, else the one copy on the
  block's leader."""
  return (bool(kernel.out_split[output]) or device == kernel.devices[0] or
          output in dict(kernel.summed))


def term_scale(kernel: Kernel, output: int) -> float:
  """Factor of a terminal output's copies (``r`` of a partial sum, else 1)."""
  return float(dict(kernel.summed).get(output, 1.0))


def is_rowed(aval: Any, b: int) -> bool:
  return bool(aval.shape) and aval.shape[0] == b



@dataclasses.dataclass(frozen=True, eq=False)
class Env:
  """What the tick builders share."""

  D: int
  n: int
  b: int
  kernels: Mapping[int, Kernel]
  stores: Mapping[tuple[Key, int], Store]
  stores_of_key: Mapping[Key, list[Store]]
  pools: tuple[Pool, ...]
  layout: Layout
  terminal_index: Mapping[Key, int]
  first_read: Mapping[tuple[Key, int, int], int] = dataclasses.field(
      default_factory=dict)
  memo: dict[tuple, Any] = dataclasses.field(default_factory=dict)
  """What depends only on the kernels present (their ports, accumulators
  and message routes), made once per plan: a plan has hundreds of ticks
  and a handful of distinct kernel sets (``remembered``)."""

  def remembered(self, key: tuple, make: Any) -> Any:
    """``make()``, made once per ``key`` for this plan."""
    value = self.memo.get(key, _MISSING)
    if value is _MISSING:
      value = self.memo[key] = make()
    return value

  def in_avals(self, kid: int) -> tuple[Aval, ...]:
    """Kernel ``kid``'s input avals as :class:`Aval`."""
    return self.remembered(("in_avals", kid), lambda: tuple(
        Aval.of(a) for a in self.kernels[kid].in_avals))

  def out_avals(self, kid: int) -> tuple[Aval, ...]:
    """Kernel ``kid``'s output avals as :class:`Aval`."""
    return self.remembered(("out_avals", kid), lambda: tuple(
        Aval.of(a) for a in self.kernels[kid].out_avals))


_MISSING = object()


def slot_dyn(D: int, entries: Mapping[int, tuple[Store, int]],
             pool: Pool) -> Dyn:
  """Slots of ``entries`` (device -> store, micro-batch); the pool's sink
  slot on the other devices."""
  base, scale = [pool.slots] * D, [0] * D
  c, mod = [0] * D, [0] * D
  for d, (s, m) in entries.items():
    base[d], scale[d], c[d], mod[d] = s.base, s.stride, m, s.slots
  return Dyn(np.array(base, np.int64), np.array(scale, np.int64),
             np.array(c, np.int64), np.array(mod, np.int64))


def assign_inputs(env: Env, kids: Sequence[int]
                  ) -> tuple[list[tuple], dict[int, tuple[int, ...]]]:
  """Read ports shared by kernels ``kids``: classes and per-kernel map
  (made once per kernel set; callers do not change them).

  A class is ``("pool", pool, local aval)`` or ``("batch", leaf, aval)``;
  the ``j``-th input of a class of every kernel uses the same port.
  """
  kids = tuple(kids)
  return env.remembered(("inputs", kids), lambda: _assign_inputs(env, kids))


def _assign_inputs(env: Env, kids: Sequence[int]
                   ) -> tuple[list[tuple], dict[int, tuple[int, ...]]]:
  kernels, stores = env.kernels, env.stores
  per_kernel: dict[int, list[tuple]] = {}
  for kid in kids:
    k = kernels[kid]
    cls_list = []
    for r, ref in enumerate(k.inputs):
      loc = env.in_avals(kid)[r]
      if ref.kind == "value":
        pools_here = {stores[(ref.key, d)].pool for d in k.devices}
        if len(pools_here) != 1:
          raise PlanError(f"{k.label} input {r} lives in different pools on"
                          f" its devices")
        cls_list.append(("pool", pools_here.pop(), loc))
      else:
        cls_list.append(("batch", ref.leaf, loc))
    per_kernel[kid] = cls_list
  return assign_ports(kids, per_kernel)


def assign_outputs(env: Env, kids: Sequence[int]
                   ) -> tuple[list[Aval], dict[int, tuple[int, ...]]]:
  """Out ports shared by kernels ``kids`` (grouped by shape; made once per
  kernel set, callers do not change them)."""
  kids = tuple(kids)
  return env.remembered(("outputs", kids), lambda: assign_ports(
      kids, {kid: env.out_avals(kid) for kid in kids}))


def assign_ports(kids: Sequence[int], per_kernel: Mapping[int, list]
            ) -> tuple[list, dict[int, tuple[int, ...]]]:
  classes: list = []
  counts: dict = {}
  for kid in kids:
    local: dict = {}
    for cls in per_kernel[kid]:
      local[cls] = local.get(cls, 0) + 1
    for cls, v in local.items():
      if cls not in counts:
        classes.append(cls)
      counts[cls] = max(counts.get(cls, 0), v)
  index: dict = {}
  ports: list = []
  for cls in classes:
    for j in range(counts[cls]):
      index[(cls, j)] = len(ports)
      ports.append(cls)
  mapping: dict[int, tuple[int, ...]] = {}
  for kid in kids:
    seen: dict = {}
    idx = []
    for cls in per_kernel[kid]:
      j = seen.get(cls, 0)
      seen[cls] = j + 1
      idx.append(index[(cls, j)])
    mapping[kid] = tuple(idx)
  return ports, mapping


@dataclasses.dataclass(frozen=True)
class Message:
  """One value (or row range of it) from a device to a store.

  Attributes:
    src: Sending device.
    port: Out port holding the value on ``src``.
    src_row: First row taken from the out port value.
    rowed: Only a row range is sent.
    payload: Shape sent.
    store: Destination store.
    dst_row: First row written in the destination slot.
    mb: Micro-batch.
  """

  src: int
  port: int
  src_row: int
  rowed: bool
  payload: Aval
  store: Store
  dst_row: int
  mb: int

  @property
  def remote(self) -> bool:
    return self.store.device != self.src


def tick_messages(env: Env, kern: Sequence[int | None], mb: np.ndarray,
                  out_map: Mapping[int, tuple[int, ...]]) -> list[Message]:
  """Messages produced by the kernels ``kern`` (per device) of one tick."""
  out = []
  for d, kid in enumerate(kern):
    if kid is None:
      continue
    ports = out_map[kid]
    routes = env.remembered(("messages", kid, d, ports), functools.partial(
        _kernel_routes, env, kid, d, ports))
    m = int(mb[d])
    out.extend(Message(*route, m) for route in routes)
  return out


def _kernel_routes(env: Env, kid: int, d: int, ports: tuple[int, ...]
                   ) -> list[tuple]:
  """The messages kernel ``kid`` on device ``d`` sends (out ports
  ``ports``), as :class:`Message` fields but the micro-batch."""
  b = env.b
  k = env.kernels[kid]
  my_rows = rows_of(k, d, b)
  out: list[tuple] = []
  for o, key in enumerate(k.outputs):
    port = ports[o]
    full = env.out_avals(kid)[o]
    for s in sorted(env.stores_of_key.get(key, ()), key=lambda s: s.device):
      if s.rows is None:
        src = s.device if s.device in k.devices else k.devices[0]
        if src == d:
          out.append((d, port, 0, False, full, s, 0))
        continue
      r0, r1 = s.rows
      if k.out_split[o]:
        lo, hi = max(r0, my_rows[0]), min(r1, my_rows[1])
        if lo >= hi:
          continue
        src_row, dst_row = lo - my_rows[0], lo - r0
      else:
        src = s.device if s.device in k.devices else k.devices[0]
        if src != d:
          continue
        lo, hi = r0, r1
        src_row, dst_row = r0, 0
      payload = full.with_rows(hi - lo)
      rowed = payload.shape != full.shape or src_row != 0
      out.append((d, port, src_row, rowed, payload, s, dst_row))
  return out



def port_users(kern: Sequence[int | None], in_map: Mapping[int, Sequence[int]],
               num_ports: int) -> list[dict[int, tuple[int, int]]]:
  """Per read port, ``device -> (kernel, input)`` of the devices reading it
  at a tick whose devices run ``kern`` (None: idle; ``in_map``: the
  ports' per-kernel map, ``assign_inputs``)."""
  users: list[dict[int, tuple[int, int]]] = [{} for _ in range(num_ports)]
  for d, kid in enumerate(kern):
    if kid is not None:
      for r, p in enumerate(in_map[kid]):
        users[p][d] = (kid, r)
  return users


def read_port(env: Env, cls: tuple, users: Mapping[int, tuple[int, int]],
              mb: np.ndarray) -> ReadPort:
  """Per-device indices of one read port (``users``: device -> input)."""
  kind, source, loc = cls
  fixed, default, row, rowed = _read_fixed(env, cls, users)
  D = env.D
  base = np.full(D, default, np.int64)
  scale = np.zeros(D, np.int64)
  c = np.zeros(D, np.int64)
  mod = np.zeros(D, np.int64)
  for d, (b0, sc, m0) in fixed.items():
    base[d], scale[d], c[d], mod[d] = b0, sc, mb[d], m0
  return ReadPort(kind, source, loc, rowed, Dyn(base, scale, c, mod),
                  np.array(row, np.int64))


def read_start(env: Env, cls: tuple, users: Mapping[int, tuple[int, int]],
               mb: np.ndarray) -> tuple[list[int], list[int], bool]:
  """``read_port``'s ``(index at iteration 0, row, rowed)`` as lists (the
  interpreted ramps' tables, built row by row)."""
  fixed, default, row, rowed = _read_fixed(env, cls, users)
  index = [default] * env.D
  for d, (b0, sc, m0) in fixed.items():
    m = int(mb[d])
    index[d] = b0 + sc * (m % m0 if m0 > 0 else m)
  return index, row, rowed


def _read_fixed(env: Env, cls: tuple, users: Mapping[int, tuple[int, int]]
                ) -> tuple[dict[int, tuple[int, int, int]], int, list[int],
                           bool]:
  """What a read port's tables hold whatever the micro-batch: per reading
  device ``(base, scale, mod)`` of ``base + scale * (mb mod m)``, the base
  of the others, the row inside the slot per device and whether a row
  range is read (made once per port and readers)."""
  key = ("read", cls, tuple(users.items()))
  return env.remembered(key, lambda: _read_tables(env, cls, users))


def _read_tables(env: Env, cls: tuple, users: Mapping[int, tuple[int, int]]
                 ) -> tuple[dict[int, tuple[int, int, int]], int, list[int],
                            bool]:
  D, b, kernels = env.D, env.b, env.kernels
  kind, source, loc = cls
  row = [0] * D
  fixed: dict[int, tuple[int, int, int]] = {}
  if kind == "pool":
    pool = env.pools[source]
    for d, (kid, r) in users.items():
      s = env.stores[(kernels[kid].inputs[r].key, d)]
      fixed[d] = (s.base, s.stride, s.slots)
      if s.rows is not None:
        want = (rows_of(kernels[kid], d, b) if kernels[kid].in_split[r]
                else (0, b))
        row[d] = want[0] - s.rows[0]
    rowed = loc.shape != pool.aval.shape or any(row)
    return fixed, pool.slots, row, rowed
  for d, (kid, r) in users.items():
    k = kernels[kid]
    fixed[d] = (rows_of(k, d, b)[0] if k.in_split[r] else 0, b, 0)
  return fixed, 0, row, True


def grad_ports(env: Env, present: Sequence[int]
                ) -> tuple[list[GradPort], dict[int, dict[int, int]]]:
  """Accumulators the kernels ``present`` at a tick add gradients to.

  Returns:
    ``(ports, grad_map)``: flat accumulators (one per dtype with a region of
    a present kernel) then slot accumulators, each once; ``grad_map[kid]``
    maps each of the kernel's slot leaves to its port (made once per kernel
    set; callers do not change them).
  """
  present = tuple(present)
  return env.remembered(("grads", present),
                        lambda: _grad_ports(env, present))


def _grad_ports(env: Env, present: Sequence[int]
                ) -> tuple[list[GradPort], dict[int, dict[int, int]]]:
  layout = env.layout
  keys: dict[tuple, GradPort] = {}
  grad_map: dict[int, dict[int, int]] = {kid: {} for kid in present}
  slot_of: dict[int, dict[int, tuple]] = {kid: {} for kid in present}
  for kid in present:
    k = env.kernels[kid]
    if not k.grads:
      continue
    for dt in layout.dtypes:
      region = layout.regions[dt].get(k.fwd)
      if region is not None and region.leaves:
        size = region.length * np.dtype(dt).itemsize
        old = keys.get(("flat", dt))
        if old is None or old.nbytes < size:
          keys[("flat", dt)] = GradPort("flat", dt, size)
    for leaf in k.grads:
      where = layout.slot_of.get((leaf, k.devices[0]))
      gathered = layout.gathered.get(leaf)
      if gathered is not None and len(k.devices) < env.D:
        port = GradPort("gathered", gathered.dtype, gathered.nbytes, leaf)
        keys.setdefault(port.key, port)
        continue
      if where is None:
        continue
      c, j = where
      cls = layout.classes[c]
      # One device's accumulator: split over the GSPMD axes (an FSDP slot
      # after its gather over the data axes).
      port = GradPort("slot", cls.dtype, cls.gathered_nbytes if cls.fsdp
                      else cls.device_nbytes, c, j)
      keys.setdefault(port.key, port)
      slot_of[kid][leaf] = port.key
  order = sorted(keys, key=lambda key: (key[0] != "flat", key[0], key[1:]))
  index = {key: i for i, key in enumerate(order)}
  for kid, leaves in slot_of.items():
    grad_map[kid] = {leaf: index[key] for leaf, key in leaves.items()}
  return [keys[key] for key in order], grad_map


__all__ = ["Env", "Message", "assign_inputs", "assign_outputs", "ctx_offset",
           "grad_ports", "is_rowed", "port_users", "read_port", "read_start",
           "rows_of", "slot_dyn", "term_counts", "term_scale",
           "tick_messages"]
