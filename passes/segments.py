"""Segments of a tick plan: straight runs, loops and interpreted ramps.

``find_loops`` groups ticks that repeat with every micro-batch index shifted
by one into ``fori_loop`` segments; ``interp_segments`` turns long straight
runs (warmup, cooldown) into table-driven ``interp`` segments, keeping ticks
that run a collective out of them.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np

from .flushes import barrier_count

if TYPE_CHECKING:
  from .plan_ir import Tick

@dataclasses.dataclass(frozen=True)
class Segment:
  """Ticks ``[start, start + period * iterations)``.

  ``kind``: ``"ticks"`` (unrolled, one pruned switch per tick), ``"loop"``
  (``fori_loop`` over iterations, the body unrolls ``period`` ticks) or
  ``"interp"`` (``fori_loop`` over the ticks with one switch over every
  kernel of the segment, driven by tables; for long warmups/cooldowns).
  """

  start: int
  period: int
  iterations: int
  kind: str = "ticks"

  @property
  def is_loop(self) -> bool:
    return self.kind == "loop"

  @property
  def end(self) -> int:
    return self.start + self.period * self.iterations


def _shift_equal(a: Tick, b: Tick) -> bool:
  """``b`` is ``a`` with every micro-batch one higher."""
  if a.kernels != b.kernels:
    return False
  busy = a.mb >= 0
  return bool(np.all(b.mb[busy] == a.mb[busy] + 1))


def find_loops(ticks: Sequence[Tick], max_period: int = 64,
               min_iterations: int = 3) -> list[Segment]:
  """Splits ``ticks`` into straight-line runs and loops.

  A loop of period ``P`` starting at tick ``s`` with ``n`` iterations needs
  tick ``t + P`` to equal tick ``t`` shifted by one micro-batch for every
  ``t`` in ``[s, s + (n - 1) P)``. Every segment starts with nothing to send
  and ends by writing its last tick's messages, so no out ports cross a
  segment (or loop iteration) boundary. The loop covering the most ticks is
  taken first, then both sides.
  """
  out: list[Segment] = []

  def solve(lo: int, hi: int) -> None:
    best = None
    for p in range(1, max_period + 1):
      if 2 * p > hi - lo:
        break
      t = lo
      while t < hi:
        if t + p >= hi or not _shift_equal(ticks[t], ticks[t + p]):
          t += 1
          continue
        a = t
        while t + p < hi and _shift_equal(ticks[t], ticks[t + p]):
          t += 1
        iters = 1 + (t - a) // p
        if iters >= min_iterations and (best is None or
                                        iters * p > best[2] * best[1]):
          best = (a, p, iters, t + p)
    if best is None:
      if hi > lo:
        out.append(Segment(lo, hi - lo, 1))
      return
    start, p, iters = _rotate(ticks, *best, min_iterations)
    solve(lo, start)
    out.append(Segment(start, p, iters, kind="loop"))
    solve(start + p * iters, hi)

  solve(0, len(ticks))
  return [s for s in out if s.period * s.iterations > 0]


def _rotate(ticks: Sequence[Tick], start: int, period: int, iterations: int,
            run_end: int, min_iterations: int) -> tuple[int, int, int]:
  """The loop's phase: ``(start, period, iterations)`` over the periodic
  ticks ``[start, run_end)`` whose body has the fewest rendezvous when its
  remote rounds are deferred (``passes.flushes``; an iteration's end
  writes what is pending, so the phase decides how many barriers an
  iteration needs), then the most iterations, then the earliest start."""
  best = None
  for r in range(period):
    s = start + r
    iters = (run_end - s) // period
    if iters < min_iterations or (r and iters < iterations - 1):
      continue
    cost = (barrier_count(ticks, range(s, s + period)), -iters, r)
    if best is None or cost < best[0]:
      best = (cost, (s, period, iters))
  return best[1] if best else (start, period, iterations)


def interp_segments(segments: Sequence[Segment], ticks: Sequence[Tick],
                    min_ticks: int, collective: frozenset[int]
                    ) -> list[Segment]:
  """Straight runs of >= ``min_ticks`` ticks become ``interp`` segments.

  Ticks running a ``collective`` kernel stay straight (a run is cut around
  them), so no collective ever sits inside the interp switch.
  """
  out: list[Segment] = []
  for seg in segments:
    if seg.is_loop:
      out.append(seg)
      continue
    start = seg.start
    for t in range(seg.start, seg.end + 1):
      cut = t == seg.end or any(k in collective for k in ticks[t].kernels
                                if k is not None)
      if not cut:
        continue
      if t > start:
        kind = "interp" if t - start >= min_ticks else seg.kind
        out.append(dataclasses.replace(seg, start=start, period=t - start,
                                       iterations=1, kind=kind))
      if t < seg.end:
        out.append(dataclasses.replace(seg, start=t, period=1, iterations=1))
      start = t + 1
  merged: list[Segment] = []
  for seg in out:  # adjacent unrolled pieces form one run again
    prev = merged[-1] if merged else None
    if (prev is not None and prev.kind == seg.kind == "ticks" and
        prev.end == seg.start):
      merged[-1] = dataclasses.replace(prev, period=prev.period + seg.period)
    else:
      merged.append(seg)
  return merged
