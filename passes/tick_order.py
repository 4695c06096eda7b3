"""Ticks packed as early as each device's order allows (opt-in).

The lowering runs a schedule tick by tick, and a tick that sends a value
ends in a ``ppermute`` both devices enter: XLA's CPU collectives
rendezvous, so such a tick lasts as long as its slowest kernel. Ticks are
made from the schedule's start times (one per distinct start), so spans
that differ from the kernels' real times pair kernels badly. ResNet18 on
``vshape(2)`` with uniform spans (F 1, B 2) runs each period as three ticks
``F0 | B0 F1 | B1`` (a device idles one tick in three) where the same
per-device order packs into two, ``F0 B1 | B0 F1``.

:func:`compact` keeps every device's order of blocks (so its memory, by
the project's convention, is unchanged) and gives each action the first
tick after its device's previous action and after every value it reads
was made. Switched on per step with ``tj.schedule(...,
switches=Switches(tick_order=True))``, or for steps made without
``switches`` by ``TESSEL_JAX_TICK_ORDER=1`` (``passes.switches``; off by
default).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any


def apply(kernels: Mapping[int, Any], actions: Sequence[Any], on: bool
          ) -> Sequence[Any]:
  """``actions`` compacted when ``on`` (``Switches.tick_order``), else
  unchanged."""
  return compact(kernels, actions) if on else actions


def compact(kernels: Mapping[int, Any], actions: Sequence[Any]
            ) -> list[Any]:
  """Actions re-timed to the earliest ticks their order and data allow.

  Args:
    kernels: Kernel id -> kernel (``devices``; ``inputs`` with ``kind``
      and ``key``; ``outputs``: the keys it writes).
    actions: ``(start, block, microbatch)`` actions; ``block`` is a
      kernel id. Their start order is kept per device.

  Returns:
    The same actions with ``start`` = tick index, sorted by it.
  """
  producer = {key: kid for kid, k in kernels.items() for key in k.outputs}
  last: dict[int, int] = {}            # device -> its last tick
  done: dict[tuple[int, int], int] = {}  # (kernel, microbatch) -> tick
  out = []
  for a in sorted(actions, key=lambda a: (a.start, a.block)):
    k = kernels[a.block]
    tick = max((last.get(d, -1) + 1 for d in k.devices), default=0)
    for ref in k.inputs:
      if ref.kind != "value":
        continue
      src = done.get((producer.get(ref.key, -1), a.microbatch))
      if src is not None:
        tick = max(tick, src + 1)
    for d in k.devices:
      last[d] = tick
    done[(a.block, a.microbatch)] = tick
    out.append(dataclasses.replace(a, start=tick))
  return sorted(out, key=lambda a: (a.start, a.block))
