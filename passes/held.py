"""When an interpreted segment sends its remote messages (held rounds).

An interp segment (``passes.interp``) is one ``fori_loop`` iteration per
tick. Sending every remote message at the boundary right after the tick
that produced it puts a ``ppermute`` (on XLA's CPU runtime a rendezvous of
every device) between every two ticks, so a device can never run ahead of
the others: on the 2-stage MLP of ``experiments.peer_bench`` the steady
period ``[F0 | -], [B0 | F1], [- | B1]`` then takes ``F + max(B, F) + B``
instead of ``F + B``, and the compact program's step was 1.3-1.4x the hand
GPipe's wall time at 0.8-0.9x its CPU (quiet, 2026-11-26).

Here a remote message is *held*: at the boundary after its tick the sender
copies it into an outbox of its round (``(2, *payload)``: slot 0 the held
message, slot 1 a sink for devices with nothing to hold), and the round's
``ppermute`` runs only at *flush* boundaries, uniform over the devices (so
every device enters the collective or none does). A message produced at
boundary ``p`` (tick ``p - 1``) may be sent at any boundary ``f`` with
``p <= f <= due`` (``due``: its earliest reader's tick) and before its
sender holds the next message of the same round (the outbox has one slot):
the fewest flush boundaries that meet every such interval are found by
greedy interval stabbing (each flush at the latest boundary the
earliest-closing interval allows), as ``passes.flushes`` does for straight
runs. Every message is sent at the first flush boundary at or after ``p``.

Pure numpy; no jax.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np


def flush_points(intervals: Sequence[tuple[int, int]], boundaries: int
                 ) -> np.ndarray:
  """Fewest boundaries meeting every ``[lo, hi]`` interval.

  Args:
    intervals: ``(lo, hi)`` boundary ranges, ``lo <= hi``.
    boundaries: Number of boundaries (``ticks + 1``).

  Returns:
    A bool array over the boundaries: True where a flush runs.
  """
  points = np.zeros(boundaries, bool)
  last = -1
  for lo, hi in sorted(intervals, key=lambda iv: iv[1]):
    if lo > hi:
      raise ValueError(f"empty send interval [{lo}, {hi}]")
    if last >= lo:
      continue
    points[hi] = True
    last = hi
  return points


def send_boundary(points: np.ndarray, produced: int) -> int:
  """The first flush boundary at or after ``produced``."""
  later = np.flatnonzero(points[produced:])
  if not later.size:
    raise ValueError(f"no flush at or after boundary {produced}")
  return produced + int(later[0])


def latest_send(produced: int, due: int, next_hold: int | None,
                ticks: int) -> int:
  """The last boundary a message produced at ``produced`` may be sent at.

  Args:
    produced: Boundary after the producing tick.
    due: Segment-relative tick of its earliest reader: past the segment's
      end, sent by its end; before ``produced`` (unknown), sent at once.
    next_hold: Boundary at which its sender holds the next message of the
      same round (None: never), which overwrites the outbox.
    ticks: Ticks of the segment (the last boundary is ``ticks``).
  """
  hi = min(max(due, produced), ticks)
  if next_hold is not None:
    hi = min(hi, next_hold - 1)
  return hi


__all__ = ["flush_points", "latest_send", "send_boundary"]
