"""Tick plan: the static tables the shard_map program is built from.

Pure Python and numpy (no tracing). From an unrolled schedule and the kernels
it builds, per *tick* (a step at which at least one block starts; empty steps
are dropped):

* which kernel each device runs and for which micro-batch;
* reads: the stash slot (or micro-batch rows) behind every kernel input;
* out ports: kernel outputs grouped by shape, so devices running different
  kernels share them;
* sends: messages from this tick's outputs to the stash, executed at the
  start of the next tick (write, then read: DESIGN §5), coloured into rounds
  of partial permutations (one ``ppermute`` each) or local writes;
* gradient ports and terminal (loss / output) accumulations.

Every value a kernel reads lives in a *store* (value key, device) with ``K``
slots used round-robin by micro-batch (``slot = base + mb % K``); stores of
the same shape share a *pool* (one array per shape on every device, plus a
dummy sink slot at the end).

Ticks that repeat with every micro-batch index shifted by one are grouped
into loops (``fori_loop`` over iterations, the body unrolls one period); all
per-device indices are ``base + scale * ((it + c) mod m)`` (:class:`Dyn`).

The plan's dataclasses live in ``passes.plan_ir``, segment finding in
``passes.segments``; both are re-exported here.
"""

from __future__ import annotations

import bisect
import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from .kernels import Key, Kernel, KernelSet
from .packing import Layout
from .plan_ir import (Aval, Dyn, GradPort, Plan, PlanError, Pool, ReadPort,
                      Round, Store, Target, TermAcc, Tick)
from .segments import Segment, find_loops, interp_segments

__all__ = ["Aval", "Dyn", "GradPort", "Plan", "PlanError", "Pool", "ReadPort",
           "Round", "Segment", "Store", "Target", "TermAcc", "Tick",
           "build_plan", "find_loops", "interp_segments"]


def build_interp(*args: Any, **kwargs: Any) -> Any:
  """See ``interp.build_interp`` (imported lazily: it imports this module)."""
  from .interp import build_interp as _build  # pylint: disable=import-outside-toplevel
  return _build(*args, **kwargs)


# --- helpers ----------------------------------------------------------------


def _rows(kernel: Kernel, device: int, b: int) -> tuple[int, int]:
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
  return _rows(kernel, device, b)[0]


def term_counts(kernel: Kernel, output: int, device: int) -> bool:
  """Whether ``device``'s copy of a terminal output of ``kernel`` counts: a
  row range or a partial sum of a split one, else the one copy on the
  block's leader."""
  return (bool(kernel.out_split[output]) or device == kernel.devices[0] or
          output in dict(kernel.summed))


def term_scale(kernel: Kernel, output: int) -> float:
  """Factor of a terminal output's copies (``r`` of a partial sum, else 1)."""
  return float(dict(kernel.summed).get(output, 1.0))


def _is_rowed(aval: Any, b: int) -> bool:
  return bool(aval.shape) and aval.shape[0] == b


# --- the planner ------------------------------------------------------------


def build_plan(ks: KernelSet, actions: Sequence[Any], num_microbatches: int,
               num_devices: int, layout: Layout,
               max_period: int = 64,
               interpret_ramps: int | None = None,
               collective: frozenset[int] = frozenset()) -> Plan:
  """Builds the tick plan.

  Args:
    ks: Kernels by graph block id.
    actions: Unrolled schedule actions (start, block, microbatch).
    num_microbatches: Micro-batches per pipeline (per data replica).
    num_devices: Devices on the pipe axis.
    layout: Parameter layout (gradient offsets).
    max_period: Longest loop body (ticks) to look for.
    interpret_ramps: Straight-line segments of at least this many ticks run
      as ``interp`` segments (None: unroll every one).
    collective: Kernel ids that run collectives over the pipe axis (blocks
      reading a sharded parameter); ticks running one are never put in an
      ``interp`` segment (its switch would hold the collective).
  """
  D = num_devices
  n = num_microbatches
  b = ks.microbatch_rows
  kernels = ks.kernels

  # Ticks: the steps at which something starts.
  steps = sorted({a.start for a in actions})
  tick_at = {s: t for t, s in enumerate(steps)}
  T = len(steps)
  run = [[None] * D for _ in range(T)]
  mbs = np.full((T, D), -1, np.int64)
  tick_of: dict[tuple[int, int], int] = {}
  for a in actions:
    t = tick_at[a.start]
    k = kernels[a.block]
    tick_of[(a.block, a.microbatch)] = t
    for d in k.devices:
      if run[t][d] is not None:
        raise PlanError(f"device {d} runs two blocks at step {a.start}")
      run[t][d] = a.block
      mbs[t, d] = a.microbatch

  # Producers and consumers of every value.
  producer: dict[Key, int] = {}
  for kid, k in kernels.items():
    for key in k.outputs:
      producer[key] = kid
  readers: dict[tuple[Key, int], list[tuple[int, int]]] = {}
  for kid, k in kernels.items():
    for r, ref in enumerate(k.inputs):
      if ref.kind == "value":
        if ref.key not in producer:
          raise PlanError(f"{k.label} reads {ref.key}, which nobody produces")
        for d in k.devices:
          readers.setdefault((ref.key, d), []).append((kid, r))

  # Stores: rows held, slots needed.
  store_rows: dict[tuple[Key, int], tuple[int, int] | None] = {}
  store_aval: dict[tuple[Key, int], Aval] = {}
  store_slots: dict[tuple[Key, int], int] = {}
  for (key, d), uses in sorted(readers.items(), key=lambda kv: (str(kv[0][0]),
                                                                kv[0][1])):
    full = ks.value_avals[key]
    local_residual = key[0] == "r"
    if local_residual or not _is_rowed(full, b):
      rows = None
      aval = Aval.of(kernels[uses[0][0]].in_avals[uses[0][1]])
    else:
      needs = {_rows(kernels[kid], d, b) if kernels[kid].in_split[r] else (0, b)
               for kid, r in uses}
      rows = needs.pop() if len(needs) == 1 else (0, b)
      aval = Aval.of(full).with_rows(rows[1] - rows[0])
    store_rows[(key, d)] = rows
    store_aval[(key, d)] = aval
    pid = producer[key]
    writes, reads = [], []
    for m in range(n):
      w = tick_of[(pid, m)] + 1
      r = max(tick_of[(kid, m)] for kid, _ in uses)
      if r < w:
        raise PlanError(
            f"value {key} of micro-batch {m} is read at tick {r} before it is"
            f" written at tick {w}")
      writes.append(w)
      reads.append(r)
    slots = 1
    for m in range(n):
      last = bisect.bisect_right(writes, reads[m]) - 1
      slots = max(slots, last - m + 1)
    store_slots[(key, d)] = slots

  _widen_split_reads(kernels, store_rows, store_aval, ks.value_avals, b)

  # Pools: one per stored shape; stores of a device get consecutive slots.
  pool_ids: dict[Aval, int] = {}
  used: dict[tuple[int, int], int] = {}
  stores: dict[tuple[Key, int], Store] = {}
  for sk in sorted(store_aval, key=lambda s: (s[1], str(s[0]))):
    aval = store_aval[sk]
    pid = pool_ids.setdefault(aval, len(pool_ids))
    base = used.get((pid, sk[1]), 0)
    used[(pid, sk[1])] = base + store_slots[sk]
    stores[sk] = Store(key=sk[0], device=sk[1], rows=store_rows[sk], aval=aval,
                       pool=pid, base=base, slots=store_slots[sk])
  pools = [None] * len(pool_ids)
  for aval, pid in pool_ids.items():
    pools[pid] = Pool(aval=aval, slots=max(
        [v for (p, _), v in used.items() if p == pid] + [0]))
  pools = tuple(pools)
  stores_of_key: dict[Key, list[Store]] = {}
  for s in stores.values():
    stores_of_key.setdefault(s.key, []).append(s)

  terminal_index = {key: j for j, key in enumerate(ks.terminals)}
  env = _Env(D=D, n=n, b=b, kernels=kernels, stores=stores,
             stores_of_key=stores_of_key, pools=pools, layout=layout,
             terminal_index=terminal_index)
  ticks = [_make_tick(env, steps[t], tuple(run[t]), mbs[t]) for t in range(T)]
  segments = find_loops(ticks, max_period=max_period)
  if interpret_ramps is not None:
    segments = interp_segments(segments, ticks, interpret_ramps, collective)
  interps = {seg.start: build_interp(env, ticks, seg.start, seg.end)
             for seg in segments if seg.kind == "interp"}
  return Plan(num_devices=D, num_microbatches=n, ticks=tuple(ticks),
              segments=tuple(segments), pools=pools, stores=stores,
              kernels=kernels, kernel_set=ks, layout=layout, interps=interps)


def _widen_split_reads(kernels: Mapping[int, Kernel],
                       store_rows: dict[tuple[Key, int], Any],
                       store_aval: dict[tuple[Key, int], Aval],
                       value_avals: Mapping[Key, Any], b: int) -> None:
  """Stores a split kernel reads hold all rows on all its devices when
  they do on one of them (another kernel there reads every row).

  One read port serves the kernel on all its devices, so its input must sit
  in one pool (one shape) everywhere; a device then reads its rows at an
  offset in the full value.
  """
  changed = True
  while changed:
    changed = False
    for k in kernels.values():
      if k.split <= 1:
        continue
      for ref in k.inputs:
        if ref.kind != "value":
          continue
        sks = [(ref.key, d) for d in k.devices]
        if len({store_aval[sk] for sk in sks}) <= 1:
          continue
        for sk in sks:
          if store_rows[sk] is not None and store_rows[sk] != (0, b):
            store_rows[sk] = (0, b)
            store_aval[sk] = Aval.of(value_avals[ref.key])
            changed = True


@dataclasses.dataclass(frozen=True, eq=False)
class _Env:
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


def _slot_dyn(D: int, entries: Mapping[int, tuple[Store, int]],
              pool: Pool) -> Dyn:
  base = np.full(D, pool.slots, np.int64)
  scale = np.zeros(D, np.int64)
  c = np.zeros(D, np.int64)
  mod = np.zeros(D, np.int64)
  for d, (s, m) in entries.items():
    base[d], scale[d], c[d], mod[d] = s.base, 1, m, s.slots
  return Dyn(base, scale, c, mod)


def assign_inputs(env: _Env, kids: Sequence[int]
                  ) -> tuple[list[tuple], dict[int, tuple[int, ...]]]:
  """Read ports shared by kernels ``kids``: classes and per-kernel map.

  A class is ``("pool", pool, local aval)`` or ``("batch", leaf, aval)``;
  the ``j``-th input of a class of every kernel uses the same port.
  """
  kernels, stores = env.kernels, env.stores
  per_kernel: dict[int, list[tuple]] = {}
  for kid in kids:
    k = kernels[kid]
    cls_list = []
    for r, ref in enumerate(k.inputs):
      loc = Aval.of(k.in_avals[r])
      if ref.kind == "value":
        pools_here = {stores[(ref.key, d)].pool for d in k.devices}
        if len(pools_here) != 1:
          raise PlanError(f"{k.label} input {r} lives in different pools on"
                          f" its devices")
        cls_list.append(("pool", pools_here.pop(), loc))
      else:
        cls_list.append(("batch", ref.leaf, loc))
    per_kernel[kid] = cls_list
  return _assign(kids, per_kernel)


def assign_outputs(env: _Env, kids: Sequence[int]
                   ) -> tuple[list[Aval], dict[int, tuple[int, ...]]]:
  """Out ports shared by kernels ``kids`` (grouped by shape)."""
  per_kernel = {kid: [Aval.of(a) for a in env.kernels[kid].out_avals]
                for kid in kids}
  return _assign(kids, per_kernel)


def _assign(kids: Sequence[int], per_kernel: Mapping[int, list]
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


def tick_messages(env: _Env, kern: Sequence[int | None], mb: np.ndarray,
                  out_map: Mapping[int, tuple[int, ...]]) -> list[Message]:
  """Messages produced by the kernels ``kern`` (per device) of one tick."""
  b = env.b
  out = []
  for d, kid in enumerate(kern):
    if kid is None:
      continue
    k = env.kernels[kid]
    my_rows = _rows(k, d, b)
    for o, key in enumerate(k.outputs):
      port = out_map[kid][o]
      full = Aval.of(k.out_avals[o])
      for s in sorted(env.stores_of_key.get(key, ()), key=lambda s: s.device):
        if s.rows is None:
          src = s.device if s.device in k.devices else k.devices[0]
          if src == d:
            out.append(Message(d, port, 0, False, full, s, 0, int(mb[d])))
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
        out.append(Message(d, port, src_row, rowed, payload, s, dst_row,
                           int(mb[d])))
  return out


def _make_tick(env: _Env, step: int, kern: tuple[int | None, ...],
               mb: np.ndarray) -> Tick:
  D, b, kernels, layout = env.D, env.b, env.kernels, env.layout
  present = sorted({k for k in kern if k is not None})
  idle = any(k is None for k in kern)
  branches = ((None,) if idle else ()) + tuple(present)
  branch_of = np.array([branches.index(k) for k in kern], np.int64)
  row_offset = np.array(
      [ctx_offset(kernels[k], d, b) if k is not None else 0
       for d, k in enumerate(kern)], np.int64)

  # Read ports.
  port_list, in_map = assign_inputs(env, present)
  users: list[dict[int, tuple[int, int]]] = [{} for _ in port_list]
  for kid in present:
    for r, p in enumerate(in_map[kid]):
      for d in kernels[kid].devices:
        users[p][d] = (kid, r)
  reads = [_read_port(env, cls, users[p], mb) for p, cls in enumerate(port_list)]

  # Out ports and messages, coloured into rounds.
  out_ports, out_map = assign_outputs(env, present)
  messages = tick_messages(env, kern, mb, out_map)
  messages.sort(key=lambda m: (not m.remote, m.payload.shape, m.payload.dtype,
                               m.src, m.store.device, str(m.store.key)))
  rounds_raw: list[dict] = []
  for msg in messages:
    for rd in rounds_raw:
      if rd["remote"] != msg.remote or rd["payload"] != msg.payload:
        continue
      if msg.src in rd["srcs"] or (msg.remote and
                                   msg.store.device in rd["dsts"]):
        continue
      break
    else:
      rd = {"remote": msg.remote, "payload": msg.payload, "srcs": set(),
            "dsts": set(), "msgs": []}
      rounds_raw.append(rd)
    rd["srcs"].add(msg.src)
    rd["dsts"].add(msg.store.device)
    rd["msgs"].append(msg)
  sends = []
  for rd in rounds_raw:
    cands = tuple(sorted({m.port for m in rd["msgs"]}))
    cand = np.zeros(D, np.int64)
    src_row = np.zeros(D, np.int64)
    perm = []
    by_pool: dict[int, dict[int, tuple[Store, int]]] = {}
    rows_by_pool: dict[int, np.ndarray] = {}
    rowed = False
    for m in rd["msgs"]:
      cand[m.src] = cands.index(m.port)
      src_row[m.src] = m.src_row
      rowed = rowed or m.rowed
      if rd["remote"]:
        perm.append((m.src, m.store.device))
      by_pool.setdefault(m.store.pool, {})[m.store.device] = (m.store, m.mb)
      rows_by_pool.setdefault(m.store.pool, np.zeros(D, np.int64))[
          m.store.device] = m.dst_row
    targets = tuple(
        Target(pool=p, slot=_slot_dyn(D, entries, env.pools[p]),
               row=rows_by_pool[p])
        for p, entries in sorted(by_pool.items()))
    sends.append(Round(remote=rd["remote"], payload=rd["payload"],
                       rowed=rowed, candidates=cands, cand=cand,
                       src_row=src_row, perm=tuple(sorted(perm)),
                       targets=targets))

  grads, grad_map = _grad_ports(env, present)
  terms = _terms(env, kern, present, out_map, mb)
  return Tick(step=step, kernels=kern, mb=mb, branches=branches,
              branch_of=branch_of, reads=tuple(reads), in_map=in_map,
              out_ports=tuple(out_ports), out_map=out_map, sends=tuple(sends),
              grads=tuple(grads), grad_map=grad_map, terms=tuple(terms),
              row_offset=row_offset)


def _read_port(env: _Env, cls: tuple, users: Mapping[int, tuple[int, int]],
               mb: np.ndarray) -> ReadPort:
  """Per-device indices of one read port (``users``: device -> input)."""
  D, b, kernels = env.D, env.b, env.kernels
  kind, source, loc = cls
  if kind == "pool":
    pool = env.pools[source]
    entries, row = {}, np.zeros(D, np.int64)
    for d, (kid, r) in users.items():
      s = env.stores[(kernels[kid].inputs[r].key, d)]
      entries[d] = (s, int(mb[d]))
      if s.rows is not None:
        want = (_rows(kernels[kid], d, b) if kernels[kid].in_split[r]
                else (0, b))
        row[d] = want[0] - s.rows[0]
    rowed = loc.shape != pool.aval.shape or bool(row.any())
    return ReadPort("pool", source, loc, rowed, _slot_dyn(D, entries, pool),
                    row)
  base = np.zeros(D, np.int64)
  scale = np.zeros(D, np.int64)
  c = np.zeros(D, np.int64)
  for d, (kid, r) in users.items():
    k = kernels[kid]
    base[d] = _rows(k, d, b)[0] if k.in_split[r] else 0
    scale[d] = b
    c[d] = mb[d]
  return ReadPort("batch", source, loc, True,
                  Dyn(base, scale, c, np.zeros(D, np.int64)),
                  np.zeros(D, np.int64))


def _grad_ports(env: _Env, present: Sequence[int]
                ) -> tuple[list[GradPort], dict[int, dict[int, int]]]:
  """Accumulators the kernels ``present`` at a tick add gradients to.

  Returns:
    ``(ports, grad_map)``: flat accumulators (one per dtype with a region of
    a present kernel) then slot accumulators, each once; ``grad_map[kid]``
    maps each of the kernel's slot leaves to its port.
  """
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
      port = GradPort("slot", cls.dtype, cls.nbytes, c, j)
      keys.setdefault(port.key, port)
      slot_of[kid][leaf] = port.key
  order = sorted(keys, key=lambda key: (key[0] != "flat", key[0], key[1:]))
  index = {key: i for i, key in enumerate(order)}
  for kid, leaves in slot_of.items():
    grad_map[kid] = {leaf: index[key] for leaf, key in leaves.items()}
  return [keys[key] for key in order], grad_map


def _terms(env: _Env, kern: Sequence[int | None], present: Sequence[int],
           out_map: Mapping[int, tuple[int, ...]], mb: np.ndarray
           ) -> list[TermAcc]:
  D, b, n = env.D, env.b, env.n
  terms = []
  for kid in present:
    k = env.kernels[kid]
    for o, key in enumerate(k.outputs):
      j = env.terminal_index.get(key)
      if j is None:
        continue
      mask = np.array([x == kid and term_counts(k, o, d)
                       for d, x in enumerate(kern)])
      row = np.zeros(D, np.int64)
      scale = np.ones(D)
      c = np.zeros(D, np.int64)
      base = np.full(D, n, np.int64)
      sc = np.zeros(D, np.int64)
      for d in k.devices:
        if k.out_split[o]:
          row[d] = _rows(k, d, b)[0]
        scale[d] = term_scale(k, o)
        base[d], sc[d], c[d] = 0, 1, mb[d]
      terms.append(TermAcc(terminal=j, port=out_map[kid][o], mask=mask,
                           row=row, rowed=bool(k.out_split[o]),
                           mb=Dyn(base, sc, c, np.zeros(D, np.int64)),
                           scale=scale))
  return terms


# --- loops ------------------------------------------------------------------
