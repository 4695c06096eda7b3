"""Interpreted segments: long warmups and cooldowns as one table-driven loop.

Unrolling every tick of a long warmup or cooldown puts a copy of each
kernel into the program for every tick it runs at, and XLA's compile time
grows with it. An *interp* segment instead runs ``fori_loop`` over its ticks;
at each tick every kernel of the segment sits in a while loop that only the
devices running it enter (``passes.predicated``); all per-tick
choices (kernel, stash slots, batch rows, message routes) are numpy tables
indexed by ``(tick, device)``. Messages go through one ``ppermute`` per
(payload shape, ring shift) lane and round, with every device taking part
(devices with nothing to send send a dummy, devices with nothing to receive
write it to the pool's sink slot).

The result is a :class:`plan_ir.Tick` whose tables are 2-D ``(ticks, devices)``
(sends: ``(ticks + 1, devices)``, row ``t`` holds the messages produced at
tick ``t - 1``), so the lowering runs it with the same code as a pruned tick.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from . import held as _held
from .plan_ir import Dyn, ReadPort, Round, Target, TermAcc, Tick
from .tick_tables import (Env, assign_inputs, assign_outputs, ctx_offset,
                          grad_ports, port_users, read_start, rows_of,
                          term_counts, term_scale, tick_messages)


def _static(values: np.ndarray) -> Dyn:
  v = np.asarray(values, np.int64)
  z = np.zeros_like(v)
  return Dyn(v, z, z, z)


def build_interp(env: Env, ticks: Sequence[Tick], start: int,
                 end: int) -> Tick:
  """The table-driven tick for ticks ``[start, end)``."""
  D, b, kernels = env.D, env.b, env.kernels
  seg = list(ticks[start:end])
  T = len(seg)
  kids = sorted({k for t in seg for k in t.kernels if k is not None})
  idle = any(k is None for t in seg for k in t.kernels)
  branches = ((None,) if idle else ()) + tuple(kids)
  branch_of = np.array([[branches.index(k) for k in t.kernels] for t in seg],
                       np.int64)
  row_offset = np.array(
      [[ctx_offset(kernels[k], d, b) if k is not None else 0
        for d, k in enumerate(t.kernels)] for t in seg], np.int64)
  port_list, in_map = assign_inputs(env, kids)
  reads = _reads(env, seg, port_list, in_map)
  out_ports, out_map = assign_outputs(env, kids)
  sends = _sends(env, seg, out_map, start)
  # Gradient accumulators: those of every kernel of the segment.
  grads, grad_map = grad_ports(env, kids)
  terms = _terms(env, seg, kids, out_map)
  return Tick(step=seg[0].step, kernels=(), mb=np.zeros((T, D), np.int64),
              branches=branches, branch_of=branch_of, reads=tuple(reads),
              in_map=in_map, out_ports=tuple(out_ports), out_map=out_map,
              sends=tuple(sends), grads=tuple(grads), grad_map=grad_map,
              terms=tuple(terms), row_offset=row_offset)


def _reads(env: Env, seg: Sequence[Tick], port_list: Sequence[Any],
           in_map: Any) -> list[ReadPort]:
  """The segment's read ports: per port its index and row tables over the
  ticks (``port_list``, ``in_map``: ``tick_tables.assign_inputs``)."""
  T, D = len(seg), env.D
  index = np.zeros((len(port_list), T, D), np.int64)
  row = np.zeros((len(port_list), T, D), np.int64)
  rowed = [False] * len(port_list)
  for tau, t in enumerate(seg):
    users = port_users(t.kernels, in_map, len(port_list))
    for p, cls in enumerate(port_list):
      idx, rows, port_rowed = read_start(env, cls, users[p], t.mb)
      index[p, tau] = idx
      row[p, tau] = rows
      rowed[p] = rowed[p] or port_rowed
  return [ReadPort(cls[0], cls[1], cls[2], rowed[p], _static(index[p]),
                   row[p])
          for p, cls in enumerate(port_list)]


def _sends(env: Env, seg: Sequence[Tick], out_map: Any,
           start: int) -> list[Round]:
  """The segment's sends, in lanes (payload shape x ring shift) of as many
  rounds as the busiest tick's source needs (``_rounds``)."""
  D = env.D
  per_tick: list[dict[tuple, dict[int, list]]] = []
  lanes: dict[tuple, int] = {}
  for t in seg:
    msgs = tick_messages(env, t.kernels, t.mb, out_map)
    msgs.sort(key=lambda m: (m.src, m.store.device, str(m.store.key),
                             m.dst_row))
    by_lane: dict[tuple, dict[int, list]] = {}
    for m in msgs:
      lane = (m.payload, (m.store.device - m.src) % D)
      by_lane.setdefault(lane, {}).setdefault(m.src, []).append(m)
    for lane, srcs in by_lane.items():
      lanes[lane] = max(lanes.get(lane, 0), max(len(v) for v in srcs.values()))
    per_tick.append(by_lane)
  return _rounds(env, per_tick, lanes, start)


def _terms(env: Env, seg: Sequence[Tick], kids: Sequence[int],
           out_map: Any) -> list[TermAcc]:
  """The segment's terminal accumulators: one per kernel output that is a
  terminal, with its per-tick mask, row, scale and micro-batch tables."""
  T, D, b, kernels = len(seg), env.D, env.b, env.kernels
  terms = []
  for kid in kids:
    k = kernels[kid]
    for o, key in enumerate(k.outputs):
      j = env.terminal_index.get(key)
      if j is None:
        continue
      mask = np.zeros((T, D), bool)
      row = np.zeros((T, D), np.int64)
      scale = np.ones((T, D))
      mb = np.full((T, D), env.n, np.int64)
      for tau, t in enumerate(seg):
        for d in k.devices:
          if t.kernels[d] != kid:
            continue
          mask[tau, d] = term_counts(k, o, d)
          scale[tau, d] = term_scale(k, o)
          if k.out_split[o]:
            row[tau, d] = rows_of(k, d, b)[0]
          mb[tau, d] = t.mb[d]
      terms.append(TermAcc(terminal=j, port=out_map[kid][o], mask=mask,
                           row=row, rowed=bool(k.out_split[o]),
                           mb=_static(mb), scale=scale))
  return terms

def _rounds(env: Env, per_tick: Sequence[dict[tuple, dict[int, list]]],
            lanes: dict[tuple, int], start: int) -> list[Round]:
  """One round per lane and index: local rounds written at the boundary
  after their tick, remote ones held until a flush (``passes.held``)."""
  T = len(per_tick)
  order = sorted(lanes, key=lambda l: (l[1] == 0, l[0].shape, l[0].dtype,
                                       l[1]))
  # Boundary tau + 1 of (lane, r): the r-th message of each source at tick
  # tau (boundaries without one left out, the others in increasing order).
  chosen_of: dict[tuple, dict[int, list]] = {
      (lane, r): {} for lane in order for r in range(lanes[lane])}
  for tau, by_lane in enumerate(per_tick):
    for lane, srcs in by_lane.items():
      for ms in srcs.values():
        for r, m in enumerate(ms):
          chosen_of[(lane, r)].setdefault(tau + 1, []).append(m)
  points = _flush_points(env, chosen_of, T, start)
  return [_round(env, lane[0], lane[1], chosen_of[(lane, r)], T, points)
          for lane in order for r in range(lanes[lane])]


def _flush_points(env: Env, chosen_of: dict, T: int, start: int
                  ) -> np.ndarray:
  """Boundaries at which the held remote rounds are sent (all at once)."""
  intervals = []
  for (lane, _), chosen in chosen_of.items():
    if not lane[1]:
      continue
    held = {}   # src -> boundaries at which it holds a message
    for p, row in chosen.items():
      for m in row:
        held.setdefault(m.src, []).append((p, m))
    for src, items in held.items():
      for i, (p, m) in enumerate(items):
        nxt = items[i + 1][0] if i + 1 < len(items) else None
        due = env.first_read.get((m.store.key, m.store.device, m.mb), -1)
        intervals.append((p, _held.latest_send(p, due - start, nxt, T)))
  return _held.flush_points(intervals, T + 1)


def _round(env: Env, payload: Any, shift: int, chosen: dict[int, list],
           T: int, points: np.ndarray) -> Round:
  """One round's tables: sender rows by production boundary, receiver rows
  by the boundary the message is written at (a remote one's flush);
  ``chosen``: the messages by production boundary (``0..T``)."""
  D = env.D
  cands = tuple(sorted({m.port for row_ in chosen.values() for m in row_}))
  cand = np.zeros((T + 1, D), np.int64)
  src_row = np.zeros((T + 1, D), np.int64)
  hold = np.ones((T + 1, D), np.int64)
  flush = np.zeros((T + 1, D), np.int64)
  pools = sorted({m.store.pool for row_ in chosen.values() for m in row_})
  slot = {p: np.full((T + 1, D), env.pools[p].slots, np.int64)
          for p in pools}
  dst_row = {p: np.zeros((T + 1, D), np.int64) for p in pools}
  rowed = False
  for p, row_ in chosen.items():
    for m in row_:
      cand[p, m.src] = cands.index(m.port)
      src_row[p, m.src] = m.src_row
      hold[p, m.src] = 0
      f = _held.send_boundary(points, p) if shift else p
      flush[f] = 1
      s = m.store
      slot[s.pool][f, s.device] = s.base + s.stride * (m.mb % s.slots)
      dst_row[s.pool][f, s.device] = m.dst_row
      rowed = rowed or m.rowed
  perm = (tuple((d, (d + shift) % D) for d in range(D)) if shift else ())
  return Round(
      remote=bool(shift), payload=payload, rowed=rowed, candidates=cands,
      cand=cand, src_row=src_row, perm=perm,
      targets=tuple(Target(p, _static(slot[p]), dst_row[p]) for p in pools),
      hold=hold if shift else None, flush=flush if shift else None)


def num_ticks(tick: Tick) -> int:
  """Ticks of an interp tick (rows of its tables)."""
  return int(tick.branch_of.shape[0])


__all__ = ["build_interp", "num_ticks"]
