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
``passes.segments`` (both re-exported here), the per-tick tables shared
with ``passes.interp`` in ``passes.tick_tables``.
"""

from __future__ import annotations

import bisect
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from .kernels import Key, Kernel, KernelSet
from .value_keys import stays_on_device
from .packing import Layout
from .plan_ir import (Aval, Dyn, GradPort, Plan, PlanError, Pool, ReadPort,
                      Round, Store, Target, TermAcc, Tick)
from . import stash_groups as _stash_groups
from .interp import build_interp
from .segments import Segment, find_loops, interp_segments
from .tick_tables import (Env, assign_inputs, assign_outputs, port_users,
                          ctx_offset, grad_ports, is_rowed, read_port,
                          rows_of, slot_dyn, term_counts, term_scale,
                          tick_messages)

__all__ = ["Aval", "Dyn", "GradPort", "Plan", "PlanError", "Pool", "ReadPort",
           "Round", "Segment", "Store", "Target", "TermAcc", "Tick",
           "build_plan", "find_loops", "interp_segments"]



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
      as ``interp`` segments (None: unroll every one; 0: no loops either,
      every tick but those running a ``collective`` kernel in ``interp``
      segments, so each kernel body sits in the program once).
    collective: Kernel ids that run collectives over the pipe axis (blocks
      reading a sharded parameter); ticks running one are never put in an
      ``interp`` segment (its switch would hold the collective).
  """
  D, n, b = num_devices, num_microbatches, ks.microbatch_rows
  kernels = ks.kernels
  steps, run, mbs, tick_of = _tick_tables(kernels, actions, D)
  producer, readers = _producers_readers(kernels)
  store_rows, store_aval, store_slots, first_read = _store_needs(
      ks, readers, producer, tick_of, n)
  _widen_split_reads(kernels, store_rows, store_aval, ks.value_avals, b)

  # Pools: one per stored shape; a kernel's stores of one pool on a device
  # side by side per micro-batch (``passes.stash_groups``).
  stores, pools = _stash_groups.allocate(store_aval, store_slots, store_rows,
                                         producer)
  stores_of_key: dict[Key, list[Store]] = {}
  for s in stores.values():
    stores_of_key.setdefault(s.key, []).append(s)

  terminal_index = {key: j for j, key in enumerate(ks.terminals)}
  env = Env(D=D, n=n, b=b, kernels=kernels, stores=stores,
             stores_of_key=stores_of_key, pools=pools, layout=layout,
             terminal_index=terminal_index, first_read=first_read)
  ticks = [_make_tick(env, steps[t], tuple(run[t]), mbs[t])
           for t in range(len(steps))]
  segments = _segments(ticks, max_period, interpret_ramps, collective)
  interps = {seg.start: build_interp(env, ticks, seg.start, seg.end)
             for seg in segments if seg.kind == "interp"}
  return Plan(num_devices=D, num_microbatches=n, ticks=tuple(ticks),
              segments=tuple(segments), pools=pools, stores=stores,
              kernels=kernels, kernel_set=ks, layout=layout, interps=interps)


def _tick_tables(kernels: Mapping[int, Kernel], actions: Sequence[Any],
                 D: int) -> tuple[list[int], list[list[int | None]],
                                  np.ndarray, dict[tuple[int, int], int]]:
  """Ticks, the steps at which something starts: ``(steps, run, mbs,
  tick_of)``, per tick its step, the kernel each device runs (None:
  idle) and its micro-batch (-1: idle), and the tick of every
  ``(kernel, micro-batch)``."""
  steps = sorted({a.start for a in actions})
  tick_at = {s: t for t, s in enumerate(steps)}
  run: list[list[int | None]] = [[None] * D for _ in steps]
  mbs = np.full((len(steps), D), -1, np.int64)
  tick_of: dict[tuple[int, int], int] = {}
  for a in actions:
    t = tick_at[a.start]
    tick_of[(a.block, a.microbatch)] = t
    for d in kernels[a.block].devices:
      if run[t][d] is not None:
        raise PlanError(f"device {d} runs two blocks at step {a.start}")
      run[t][d] = a.block
      mbs[t, d] = a.microbatch
  return steps, run, mbs, tick_of


def _producers_readers(kernels: Mapping[int, Kernel]
                       ) -> tuple[dict[Key, int],
                                  dict[tuple[Key, int], list[tuple[int, int]]]]:
  """The kernel producing every value, and per ``(value, device)`` the
  ``(kernel, input index)`` reading it there."""
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
  return producer, readers


def _store_needs(ks: KernelSet,
                 readers: Mapping[tuple[Key, int], list[tuple[int, int]]],
                 producer: Mapping[Key, int],
                 tick_of: Mapping[tuple[int, int], int], n: int
                 ) -> tuple[dict, dict, dict, dict]:
  """Per store ``(value, device)``: the rows it holds (None: the whole
  value), its aval and its slots; and the first tick reading each
  ``(value, device, micro-batch)``."""
  store_rows: dict[tuple[Key, int], tuple[int, int] | None] = {}
  store_aval: dict[tuple[Key, int], Aval] = {}
  store_slots: dict[tuple[Key, int], int] = {}
  first_read: dict[tuple[Key, int, int], int] = {}
  for (key, d), uses in sorted(readers.items(), key=lambda kv: (str(kv[0][0]),
                                                                kv[0][1])):
    store_rows[(key, d)], store_aval[(key, d)] = _store_shape(
        ks, key, d, uses)
    for m in range(n):
      first_read[(key, d, m)] = min(tick_of[(kid, m)] for kid, _ in uses)
    store_slots[(key, d)] = _slots_needed(key, producer[key], uses, tick_of,
                                          n)
  return store_rows, store_aval, store_slots, first_read


def _store_shape(ks: KernelSet, key: Key, d: int,
                 uses: Sequence[tuple[int, int]]
                 ) -> tuple[tuple[int, int] | None, Aval]:
  """``(rows, aval)`` of the store of ``key`` on device ``d``: the rows
  its readers there need (None: not rowed, or a local residual)."""
  kernels, b = ks.kernels, ks.microbatch_rows
  full = ks.value_avals[key]
  if stays_on_device(key) or not is_rowed(full, b):  # as read
    return None, Aval.of(kernels[uses[0][0]].in_avals[uses[0][1]])
  needs = {rows_of(kernels[kid], d, b) if kernels[kid].in_split[r]
           else (0, b)
           for kid, r in uses}
  rows = needs.pop() if len(needs) == 1 else (0, b)
  return rows, Aval.of(full).with_rows(rows[1] - rows[0])


def _slots_needed(key: Key, pid: int, uses: Sequence[tuple[int, int]],
                  tick_of: Mapping[tuple[int, int], int], n: int) -> int:
  """Slots a store of ``key`` needs: the most micro-batches written
  (the tick after ``pid`` makes one) and not yet read at once."""
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
  return slots


def _segments(ticks: Sequence[Tick], max_period: int,
              interpret_ramps: int | None, collective: frozenset[int]
              ) -> list[Segment]:
  """The plan's segments (``build_plan``'s ``interpret_ramps``)."""
  if interpret_ramps == 0:
    segments = [Segment(0, len(ticks), 1)] if ticks else []
  else:
    segments = find_loops(ticks, max_period=max_period)
  if interpret_ramps is not None:
    segments = interp_segments(segments, ticks, max(interpret_ramps, 1),
                               collective)
  return segments


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



def _make_tick(env: Env, step: int, kern: tuple[int | None, ...],
               mb: np.ndarray) -> Tick:
  """One tick: device ``d`` runs kernel ``kern[d]`` (None: idle) on
  micro-batch ``mb[d]``; its read ports, out ports, message rounds,
  gradient ports and terminal accumulations."""
  b, kernels = env.b, env.kernels
  present = sorted({k for k in kern if k is not None})
  idle = any(k is None for k in kern)
  branches = ((None,) if idle else ()) + tuple(present)
  branch_of = np.array([branches.index(k) for k in kern], np.int64)
  row_offset = np.array(
      [ctx_offset(kernels[k], d, b) if k is not None else 0
       for d, k in enumerate(kern)], np.int64)

  # Read ports.
  port_list, in_map = assign_inputs(env, present)
  users = port_users(kern, in_map, len(port_list))
  reads = [read_port(env, cls, users[p], mb) for p, cls in enumerate(port_list)]

  # Out ports and messages, coloured into rounds.
  out_ports, out_map = assign_outputs(env, present)
  messages = tick_messages(env, kern, mb, out_map)
  messages.sort(key=lambda m: (not m.remote, m.payload.shape, m.payload.dtype,
                               m.src, m.store.device, str(m.store.key)))
  sends = _rounds(env, messages)

  grads, grad_map = grad_ports(env, present)
  terms = _terms(env, kern, present, out_map, mb)
  return Tick(step=step, kernels=kern, mb=mb, branches=branches,
              branch_of=branch_of, reads=tuple(reads), in_map=in_map,
              out_ports=tuple(out_ports), out_map=out_map, sends=tuple(sends),
              grads=tuple(grads), grad_map=grad_map, terms=tuple(terms),
              row_offset=row_offset)


def _rounds(env: Env, messages: Sequence[Any]) -> list[Round]:
  """A tick's messages (sorted) coloured into rounds: each a partial
  permutation of one payload (remote: one ``ppermute``) or local writes,
  at most one message per source (and, remote, per receiver)."""
  return [_round(env, rd) for rd in _colour(messages)]


def _colour(messages: Sequence[Any]) -> list[dict[str, Any]]:
  """Messages grouped greedily, in order, into the first round of their
  kind and payload that neither their source nor (remote) their receiver
  is in yet."""
  rounds_raw: list[dict[str, Any]] = []
  of_kind: dict[tuple[bool, Any], list[dict[str, Any]]] = {}
  for msg in messages:
    kind = of_kind.setdefault((msg.remote, msg.payload), [])
    for rd in kind:   # the rounds of its kind and payload, in order
      if msg.src in rd["srcs"] or (msg.remote and
                                   msg.store.device in rd["dsts"]):
        continue
      break
    else:
      rd = {"remote": msg.remote, "payload": msg.payload, "srcs": set(),
            "dsts": set(), "msgs": []}
      rounds_raw.append(rd)
      kind.append(rd)
    rd["srcs"].add(msg.src)
    rd["dsts"].add(msg.store.device)
    rd["msgs"].append(msg)
  return rounds_raw


def _round(env: Env, rd: Mapping[str, Any]) -> Round:
  """The :class:`Round` of one group of :func:`_colour`."""
  D = env.D
  msgs = rd["msgs"]
  cands = tuple(sorted({m.port for m in msgs}))
  cand, src_row = [0] * D, [0] * D
  perm = []
  by_pool: dict[int, dict[int, tuple[Store, int]]] = {}
  rows_by_pool: dict[int, list[int]] = {}
  for m in msgs:
    store = m.store
    cand[m.src] = cands.index(m.port)
    src_row[m.src] = m.src_row
    if rd["remote"]:
      perm.append((m.src, store.device))
    by_pool.setdefault(store.pool, {})[store.device] = (store, m.mb)
    rows_by_pool.setdefault(store.pool, [0] * D)[store.device] = m.dst_row
  targets = tuple(
      Target(pool=p, slot=slot_dyn(D, entries, env.pools[p]),
             row=np.array(rows_by_pool[p], np.int64))
      for p, entries in sorted(by_pool.items()))
  first_read = env.first_read
  due = min((first_read.get((m.store.key, m.store.device, m.mb), -1)
             for m in msgs), default=-1)
  return Round(remote=rd["remote"], payload=rd["payload"],
               rowed=any(m.rowed for m in msgs), candidates=cands,
               cand=np.array(cand, np.int64),
               src_row=np.array(src_row, np.int64), perm=tuple(sorted(perm)),
               targets=targets, due=due)


def _terms(env: Env, kern: Sequence[int | None], present: Sequence[int],
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
          row[d] = rows_of(k, d, b)[0]
        scale[d] = term_scale(k, o)
        base[d], sc[d], c[d] = 0, 1, mb[d]
      terms.append(TermAcc(terminal=j, port=out_map[kid][o], mask=mask,
                           row=row, rowed=bool(k.out_split[o]),
                           mb=Dyn(base, sc, c, np.zeros(D, np.int64)),
                           scale=scale))
  return terms


# --- loops ------------------------------------------------------------------
