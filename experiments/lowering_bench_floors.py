"""Floors of a lowered step from its kernels' in-program times.

A step can be no faster than the busiest device's kernels. Two devices
only wait for each other at a rendezvous: on XLA's CPU runtime every
``ppermute`` is one, and the lowering holds remote messages and sends them
together only where a reader needs them (``passes.held`` in interpreted
segments, ``passes.flushes`` in straight runs and loop bodies). Between two
rendezvous each device runs its own kernels, so the *sync floor* is the
sum, over the intervals between rendezvous, of the slowest device's kernel
time within the interval. The per-tick *lockstep floor* (every tick as
long as its slowest kernel) is the floor only where every tick ends in a
rendezvous.

:func:`kernel_parts` charges a kernel more than its own code: every
instruction of the computation that holds it (its switch branch or
predicated loop body: its parameter reads, stash reads and gradient
accumulation), split by part, so the floors can be taken over what each
device does around its kernels too.

Pure numpy over the plan (``passes.plan_ir.Plan``) and the HLO text; no
jax.
"""

from __future__ import annotations

import collections
import re
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from experiments import step_profile
from tessel_jax.passes import flushes as _flushes

_COMPUTATION = re.compile(r"^(?:ENTRY )?%(\S+) ")


def sync_after(plan: Any) -> list[int]:
  """Global tick indices after which the devices rendezvous.

  Interpreted segments: the boundaries where a remote round flushes
  (``Round.flush``); straight runs and loop bodies: before each tick where
  ``passes.flushes.remote_flushes`` writes held rounds, and at a run's (or
  loop iteration's) end when something is pending.
  """
  out: set[int] = set()
  for seg in plan.segments:
    if seg.kind == "interp":
      spec = plan.interps[seg.start]
      for rd in spec.sends:
        if rd.remote and rd.flush is not None:
          for b in np.flatnonzero(np.asarray(rd.flush).any(axis=1)):
            out.add(seg.start + int(b) - 1)
      continue
    runs = ([list(range(seg.start + i * seg.period,
                        seg.start + (i + 1) * seg.period))
             for i in range(seg.iterations)] if seg.is_loop
            else [list(range(seg.start, seg.end))])
    for run in runs:
      for i, written in enumerate(
          _flushes.remote_flushes(plan.ticks, run)):
        if written:
          out.add(run[i] - 1 if i < len(run) else run[-1])
  return sorted(t for t in out if t >= 0)


def floors(plan: Any, kernel_s: Mapping[int, float]) -> dict[str, Any]:
  """The busiest device's, the lockstep and the sync floor (ms).

  Args:
    plan: The lowered plan (``ticks``, ``segments``, ``interps``,
      ``num_devices``).
    kernel_s: Kernel id -> seconds its code ran in one traced step, summed
      over its calls (``experiments.step_profile.kernel_seconds``); each
      call is charged the mean.
  """
  ticks: Sequence[Any] = plan.ticks
  calls = collections.Counter(k for t in ticks for k in t.kernels
                              if k is not None)
  per_call = {k: kernel_s.get(k, 0.0) / c for k, c in calls.items()}
  per_tick = np.array([[per_call[k] if k is not None else 0.0
                        for k in t.kernels] for t in ticks])
  per_dev = per_tick.sum(axis=0)
  syncs = sync_after(plan)
  sync_floor, lo = 0.0, 0
  for s in syncs + [len(ticks) - 1]:
    if s >= lo:
      sync_floor += float(per_tick[lo:s + 1].sum(axis=0).max())
      lo = s + 1
  return {"in_program_kernel_ms_by_device": [round(1e3 * float(x), 1)
                                             for x in per_dev],
          "in_program_busiest_ms": round(1e3 * float(per_dev.max()), 1),
          "lockstep_ms": round(1e3 * float(per_tick.max(axis=1).sum()), 1),
          "sync_floor_ms": round(1e3 * sync_floor, 1),
          "rendezvous": len(syncs), "ticks": len(ticks)}


def instruction_kernels(hlo_text: str) -> dict[str, int]:
  """HLO instruction name -> the kernel whose computation holds it.

  A computation (outside fusions) holding instructions of exactly one
  kernel's own code (scope ``tj_kernel/k<id>``) is that kernel's branch or
  loop body: every instruction in it is charged to the kernel.
  """
  kernel_of = step_profile.kernel_instructions(hlo_text)
  members: dict[str, list[str]] = collections.defaultdict(list)
  kernels: dict[str, set[int]] = collections.defaultdict(set)
  comp = None
  for line in hlo_text.splitlines():
    m = _COMPUTATION.match(line)
    if m and line.rstrip().endswith("{"):
      fused = m.group(1).startswith(("fused", "wrapped"))
      comp = None if fused else m.group(1)
      continue
    m = step_profile.INSTR.match(line)
    if m is None or comp is None:
      continue
    members[comp].append(m.group(1))
    if m.group(1) in kernel_of:
      kernels[comp].add(int(kernel_of[m.group(1)][1:]))
  return {name: next(iter(ks)) for comp, ks in kernels.items()
          if len(ks) == 1 for name in members[comp]}


def kernel_parts(events: Sequence[Mapping[str, Any]], hlo_text: str
                 ) -> dict[int, dict[str, float]]:
  """Kernel id -> part (``step_profile.PARTS``) -> seconds of the traced
  step spent in that kernel's computation (self times, all threads)."""
  parts = step_profile.instruction_parts(hlo_text)
  owner = instruction_kernels(hlo_text)
  labels = {name: f"{k}|{parts.get(name, 'other')}"
            for name, k in owner.items()}
  out: dict[int, dict[str, float]] = collections.defaultdict(dict)
  for label, secs in step_profile.label_times(events, labels).items():
    k, part = label.split("|")
    out[int(k)][part] = secs
  return dict(out)


def inclusive_floors(plan: Any, parts: Mapping[int, Mapping[str, float]]
                     ) -> dict[str, Any]:
  """:func:`floors` over each kernel's whole computation (its code, its
  parameter and stash reads, its gradient accumulation), with the
  per-device seconds of each part."""
  got = floors(plan, {k: sum(p.values()) for k, p in parts.items()})
  by_dev: list[dict[str, float]] = [collections.defaultdict(float)
                                    for _ in range(plan.num_devices)]
  for k, p in parts.items():
    for d in plan.kernels[k].devices:
      for part, secs in p.items():
        by_dev[d][part] += secs
  return {"inclusive_" + key: v for key, v in got.items()
          if key not in ("rendezvous", "ticks")} | {
              "parts_ms_by_device": [{p: round(1e3 * s, 1)
                                      for p, s in sorted(d.items())}
                                     for d in by_dev]}


__all__ = ["floors", "inclusive_floors", "instruction_kernels",
           "kernel_parts", "sync_after"]
