"""When a straight run of ticks writes its remote messages (deferred sends).

A ``ppermute`` on XLA's CPU runtime is a rendezvous of every device: each
one is a barrier, and a barrier placed while one device still has work the
schedule lets it overlap with the others' makes the others wait. A remote
round produced at tick ``t`` only has to be written before its earliest
reader (``Round.due``), so the lowering holds it and writes every pending
remote round together at the first tick at which one of them is due: as
few barriers as the messages allow (greedy interval stabbing: each barrier
sits at the latest point the earliest-due message permits), and each
barrier between the ticks where the schedule needs it. Local rounds are
written at the next tick as before (no barrier). Whatever is still pending
at the end of a run (or loop iteration) is written there.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any


def _remote(tick: Any) -> list[Any]:
  return [rd for rd in tick.sends if rd.remote]


def _due(tick_index: int, rd: Any) -> int:
  """Tick before which ``rd`` (produced at ``tick_index``) is written."""
  return rd.due if rd.due > tick_index else tick_index + 1


def remote_flushes(ticks: Sequence[Any], run: Sequence[int]
                   ) -> list[tuple[int, ...]]:
  """Which ticks' remote rounds are written before each tick of ``run``.

  Args:
    ticks: The plan's ticks.
    run: Tick indices of a straight run or loop body, in order.

  Returns:
    ``len(run) + 1`` entries: entry ``i`` lists the positions ``j < i``
    (into ``run``) whose remote rounds are written just before ``run[i]``;
    the last entry is what is written at the end of the run.
  """
  pending: list[int] = []
  out: list[tuple[int, ...]] = []
  for i, t in enumerate(run):
    if i and _remote(ticks[run[i - 1]]):
      pending.append(i - 1)
    if any(_due(run[j], rd) <= t for j in pending
           for rd in _remote(ticks[run[j]])):
      out.append(tuple(pending))
      pending = []
    else:
      out.append(())
  if run and _remote(ticks[run[-1]]):
    pending.append(len(run) - 1)
  out.append(tuple(pending))
  return out


def merge_rounds(rounds: Sequence[Any]) -> list[list[int]]:
  """Groups remote rounds written at one point into shared ``ppermute``s.

  Rounds with the same payload whose senders are disjoint and whose
  receivers are disjoint form one partial permutation (first fit, in
  order). Returns lists of indices into ``rounds``.
  """
  groups: list[tuple[Any, set[int], set[int], list[int]]] = []
  for i, rd in enumerate(rounds):
    srcs = {a for a, _ in rd.perm}
    dsts = {b for _, b in rd.perm}
    for payload, gs, gd, members in groups:
      if payload == rd.payload and not gs & srcs and not gd & dsts:
        gs |= srcs
        gd |= dsts
        members.append(i)
        break
    else:
      groups.append((rd.payload, srcs, dsts, [i]))
  return [members for *_, members in groups]


def barrier_count(ticks: Sequence[Any], run: Sequence[int]) -> int:
  """Rendezvous points of ``run`` when its remote rounds are deferred."""
  return sum(1 for f in remote_flushes(ticks, run) if f)


__all__ = ["barrier_count", "merge_rounds", "remote_flushes"]
