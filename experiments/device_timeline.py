"""One traced step split per device and per rendezvous interval.

XLA:CPU runs each fake device's program on a thread of its pool, but not
always the same one: after a collective the device's program goes on on
whichever thread finished the rendezvous. ``experiments.step_profile``
therefore sums its parts over all threads. Here each thread's instruction
events are cut at the collectives (``passes.lower``'s ``tj_ppermute``
scope): between two collectives a thread runs one device's program, and
the kernels it runs name that device (``Plan.kernels[k].devices``). A run
without kernels takes the device that the other threads' concurrent runs
leave free (2 devices: the other one). The entry computation before the
first collective (zero-fills, hoisted parameter work) is an exception: its
instructions also move between threads without a collective (measured on
ResNet18's placed step), so the first interval of each device is "the
prologue", not one device's own.

:func:`per_device` gives, per device, the step's self times by part
(``step_profile.PARTS``: kernels, ppermute/rendezvous -- the wait for the
partner included --, stash, gradient accumulation, ...), and per
rendezvous interval (the ticks between two collectives of the device) the
same split, so a step's critical device and where it waits can be read
off. :func:`busy_overlap` is the wall time during which both device
threads ran an instruction at once. No jax import: pure trace reading.
"""

from __future__ import annotations

import collections
from collections.abc import Mapping, Sequence
from typing import Any

from experiments import step_profile

_SYNC = "ppermute/rendezvous"


def _runs(events: Sequence[Mapping[str, Any]], parts: Mapping[str, str]
          ) -> list[list[tuple[float, float, str]]]:
  """Per thread, its instruction events ``(ts, dur, name)`` cut after each
  collective's end: one list per run (a run ends with its collective)."""
  by_tid: dict[Any, list] = collections.defaultdict(list)
  for e in events:
    if e.get("ph") == "X" and e.get("name") in parts:
      by_tid[e.get("tid")].append((float(e["ts"]), float(e.get("dur", 0.0)),
                                   e["name"]))
  runs = []
  for evs in by_tid.values():
    evs.sort(key=lambda x: (x[0], -x[1]))
    cur: list = []
    for ev in evs:
      cur.append(ev)
      if parts[ev[2]] == _SYNC and _is_collective(ev[2]):
        runs.append(cur)
        cur = []
    if cur:
      runs.append(cur)
  return runs


def _is_collective(name: str) -> bool:
  """Whether an instruction name is a collective's (not its payload)."""
  return name.startswith(("ppermute", "collective-permute", "all-reduce",
                          "all-gather", "all-to-all", "reduce-scatter"))


def _run_device(run: Sequence[tuple[float, float, str]],
                kernel_of: Mapping[str, int],
                device_of: Mapping[int, tuple[int, ...]]) -> int | None:
  """The device whose kernels the run executes (None: no kernel, or the
  kernels of several devices: not one device's run)."""
  devs = {d for _, _, n in run if n in kernel_of
          for d in device_of[kernel_of[n]]}
  return devs.pop() if len(devs) == 1 else None


def per_device(events: Sequence[Mapping[str, Any]], hlo_text: str,
               device_of: Mapping[int, tuple[int, ...]],
               num_devices: int) -> dict[str, Any]:
  """Self times of one traced step per device and rendezvous interval.

  Args:
    events: The step's trace events (``step_profile.trace_events``).
    hlo_text: The compiled program's HLO text.
    device_of: Kernel id -> the devices it runs on (its plan kernel's
      ``devices``); a kernel on several devices names none.
    num_devices: Devices of the pipe axis.

  Returns:
    ``{"devices": [{part: ms} per device], "intervals": [[{part: ms}
    per interval] per device], "unassigned_ms": ms of runs no device
    could be given}``; ``kernels`` split by kernel id as ``k<id>``.
  """
  parts = step_profile.instruction_parts(hlo_text)
  kernel_of = {n: int(k[1:]) for n, k in
               step_profile.kernel_instructions(hlo_text).items()}
  one = {k: d for k, d in device_of.items() if len(d) == 1}
  runs = _runs(events, parts)
  owner = [_run_device(r, kernel_of, one) for r in runs]
  _fill_by_concurrency(runs, owner, num_devices)
  per_dev = [collections.defaultdict(float) for _ in range(num_devices)]
  intervals: list[list[tuple[float, dict]]] = [[] for _ in range(num_devices)]
  unassigned = 0.0
  for run, dev in zip(runs, owner):
    labels = {n: (f"k{kernel_of[n]}" if n in kernel_of else parts[n])
              for _, _, n in run}
    got = step_profile.label_times(
        [{"ph": "X", "ts": ts, "dur": dur, "name": n, "tid": 0}
         for ts, dur, n in run], labels)
    if dev is None:
      unassigned += 1e3 * sum(got.values())
      continue
    ms = {k: 1e3 * v for k, v in got.items()}
    for k, v in ms.items():
      per_dev[dev][k] += v
    intervals[dev].append((run[0][0], ms))
  return {"devices": [_rounded(p) for p in per_dev],
          "intervals": [[_rounded(m) for _, m in sorted(iv, key=lambda x: x[0])]
                        for iv in intervals],
          "unassigned_ms": round(unassigned, 3)}


def _fill_by_concurrency(runs: Sequence[Sequence[tuple[float, float, str]]],
                         owner: list[int | None], num_devices: int) -> None:
  """Gives a kernel-less run the device no run overlapping it holds, when
  exactly one is left (in place)."""
  span = [(r[0][0], r[-1][0] + r[-1][1]) for r in runs]
  for i, dev in enumerate(owner):
    if dev is not None:
      continue
    lo, hi = span[i]
    held = {owner[j] for j, (a, b) in enumerate(span)
            if j != i and owner[j] is not None and a < hi and lo < b}
    free = set(range(num_devices)) - held
    if len(free) == 1:
      owner[i] = free.pop()


def _rounded(d: Mapping[str, float]) -> dict[str, float]:
  return {k: round(v, 3) for k, v in sorted(d.items())}


def busy_overlap(events: Sequence[Mapping[str, Any]], hlo_text: str
                 ) -> dict[str, float]:
  """``{"span_ms", "busy_ms" (per thread, summed), "overlap_ms"}``: the
  wall time from the first to the last instruction, the threads' busy
  time (outside collectives) and the time two threads were busy at once."""
  parts = step_profile.instruction_parts(hlo_text)
  points = []
  for run in _runs(events, parts):
    iv = sorted((ts, ts + dur) for ts, dur, n in run if parts[n] != _SYNC)
    merged: list[list[float]] = []
    for a, b in iv:
      if merged and a <= merged[-1][1]:
        merged[-1][1] = max(merged[-1][1], b)
      else:
        merged.append([a, b])
    for a, b in merged:
      points += [(a, 1), (b, -1)]
  if not points:
    return {"span_ms": 0.0, "busy_ms": 0.0, "overlap_ms": 0.0}
  points.sort()
  depth, last, busy, both = 0, points[0][0], 0.0, 0.0
  for t, step in points:
    busy += depth * (t - last)
    both += (t - last) if depth >= 2 else 0.0
    depth, last = depth + step, t
  return {"span_ms": round((points[-1][0] - points[0][0]) / 1e3, 3),
          "busy_ms": round(busy / 1e3, 3), "overlap_ms": round(both / 1e3, 3)}


__all__ = ["busy_overlap", "per_device"]
