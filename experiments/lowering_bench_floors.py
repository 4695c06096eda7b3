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

Pure numpy over the plan (``passes.plan_ir.Plan``); no jax.
"""

from __future__ import annotations

import collections
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from tessel_jax.passes import flushes as _flushes


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
  return {"in_program_kernel_ms_by_device": [round(1e3 * x, 1)
                                             for x in per_dev],
          "in_program_busiest_ms": round(1e3 * float(per_dev.max()), 1),
          "lockstep_ms": round(1e3 * float(per_tick.max(axis=1).sum()), 1),
          "sync_floor_ms": round(1e3 * sync_floor, 1),
          "rendezvous": len(syncs), "ticks": len(ticks)}


__all__ = ["floors", "sync_after"]
