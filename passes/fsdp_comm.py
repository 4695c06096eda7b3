"""The FSDP collectives of a lowered step, for the predicted step time.

FSDP slots (``SlotClass.fsdp``) are stored split over the data axes. Per
step they are all-gathered once before the first tick and their gradients
reduce-scattered once after the last (one collective per slot class each
way). Per block (``passes.fsdp_tick``) a tick all-gathers each role its
kernels read (one collective per ``(class, role)``) and reduce-scatters
each gradient role; a straight run of ticks reuses a role whose slots do not
change (a gradient role: whose slots agree on the devices using it),
while the first tick of a loop iteration gathers again. In an interpreted
tick each device gathers, inside its kernel's loop, only the leaves of the
kernel it runs at that tick and reduce-scatters their gradients there
(``passes.fsdp_kernel``): a reduce-scatter per gradient role of the
tick's kernels, and a gather per role where a device's kernel reads other
slots than the role's last gather on that device in the segment. This count follows those rules
(``fsdp_tick.gather_tick``, ``before_tick``), with a run taken as the
ticks of one segment (of one loop iteration).

Each collective moves, into one device, the slots' gathered bytes less
the shard it holds; :func:`collectives` lists them with their tick.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

from . import fsdp_kernel, fsdp_tick


@dataclasses.dataclass(frozen=True)
class Collective:
  """One FSDP all-gather or reduce-scatter.

  Attributes:
    step: Schedule step of the tick it runs at (before the tick: gather;
      after: scatter); -1 / the last tick's step for per step.
    kind: ``"gather"`` or ``"scatter"``.
    nbytes: Bytes one device receives.
  """

  step: int
  kind: str
  nbytes: int


def _received(cls: Any, slots: int = 1) -> int:
  return slots * (cls.gathered_nbytes - cls.device_nbytes)


def _reuse_from_previous(plan: Any) -> list[bool]:
  """Per tick: a role may be reused from the tick before (same straight
  run of one segment, not interpreted, not a loop iteration's first)."""
  ok = [False] * len(plan.ticks)
  for seg in plan.segments:
    if seg.kind == "interp":
      continue
    for t in range(seg.start + 1, seg.end):
      ok[t] = not (seg.is_loop and (t - seg.start) % seg.period == 0)
  return ok


def _interp_gathers(layout: Any, plan: Any) -> dict[int, set]:
  """Plan tick -> the roles some device gathers there, for the ticks of
  interpreted segments whose kernels run in their own loops (the gathered
  buffers carried across ticks, ``fsdp_kernel.regather``)."""
  out: dict[int, set] = {}
  for seg in plan.segments:
    spec = plan.interps.get(seg.start) if seg.kind == "interp" else None
    if spec is None or len(spec.branches) < 2:
      continue
    tables = fsdp_kernel.regather(layout, plan.kernels, spec)
    for tau in range(seg.end - seg.start):
      out[seg.start + tau] = {r for r, t in tables.items() if t[tau].any()}
  return out


def _per_block(layout: Any, plan: Any) -> list[Collective]:
  """As ``fsdp_tick.gather_tick`` (a run's last gather per role, reused
  where it moves the same slots) and ``before_tick`` (a run's pending
  gradient roles merged while their slots agree, one reduce-scatter each);
  an interpreted tick gathers and scatters every role of its kernels."""
  out: list[Collective] = []
  reuse = _reuse_from_previous(plan)
  gathered: dict = {}
  pending: dict = {}
  again = _interp_gathers(layout, plan)
  for t, tick in enumerate(plan.ticks):
    shape = tick
    if not reuse[t]:
      gathered, pending = {}, {}
    for key, (table, used) in fsdp_tick._roles_used(
        layout, plan.kernels, shape, False).items():
      hit = gathered.get(key)
      if t in again:
        hit = table if key not in again[t] else None
      if hit is None or not np.array_equal(hit[used], table[used]):
        out.append(Collective(tick.step, "gather",
                              _received(layout.classes[key[0]])))
        gathered[key] = table
    for key, (table, used) in fsdp_tick._roles_used(
        layout, plan.kernels, shape, True).items():
      if key in pending:
        old, was = pending[key]
        both = used & was
        if np.array_equal(old[both], table[both]):
          pending[key] = (np.where(used, table, old), used | was)
          continue
      out.append(Collective(tick.step, "scatter",
                            _received(layout.classes[key[0]])))
      pending[key] = (table, used)
  return out


def collectives(layout: Any, plan: Any) -> list[Collective]:
  """The FSDP collectives of one step of ``plan`` on ``layout`` (empty
  without FSDP slots); see the module docstring."""
  if not layout.has_fsdp:
    return []
  if fsdp_tick.per_block(layout):
    return _per_block(layout, plan)
  last = plan.ticks[-1].step if plan.ticks else 0
  fsdp = [c for c in layout.classes if c.fsdp]
  return ([Collective(-1, "gather", _received(c, c.count)) for c in fsdp] +
          [Collective(last, "scatter", _received(c, c.count)) for c in fsdp])


def seconds(layout: Any, plan: Any, link: Any) -> float:
  """Seconds of the step's FSDP collectives, each priced by ``link``
  (``latency + bytes / bandwidth``) and run serially with the ticks."""
  return sum(link.seconds(c.nbytes) for c in collectives(layout, plan))
