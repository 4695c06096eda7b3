"""An interp tick's messages written by the kernel that produced them.

An interp tick (``passes.interp``) describes its messages as rounds over the
whole segment: at every boundary every device picked its payload among the
round's candidate out ports and wrote it into the stash (a sink slot when it
had nothing to send), so each boundary ran every local round on every device
(43 rounds per boundary on the README GPT's mshape(4): 43 selects and
stash writes on each of 4 devices at each of 82 ticks).

Here each kernel, inside its own 0/1-trip loop (``passes.predicated``),
writes the rounds it produces, right after it runs, on the devices running
it: local rounds into the stash, remote ones into their outbox
(``passes.held``). A round is written by a kernel only if that kernel
produces it at some tick on some device; a device runs one kernel per tick,
so whatever a round carries at boundary ``tau + 1`` was produced by the
kernel that ran at tick ``tau``. Pure numpy.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import numpy as np


@dataclasses.dataclass(frozen=True, eq=False)
class KernelSend:
  """One round a kernel writes inside its loop.

  Attributes:
    round: Index into the tick's ``sends``.
    outbox: Index among the tick's remote rounds (-1: a local round).
    ports: The out ports the kernel sends this round from (one unless
      the kernel sends it from different ports at different ticks or on
      different devices).
    pick: Per production boundary and device: position in ``ports``.
  """

  round: int
  outbox: int
  ports: tuple[int, ...]
  pick: np.ndarray


def _produces(rd: Any, runs: np.ndarray, sinks: Sequence[int]) -> np.ndarray:
  """Where (boundary, device) ``rd`` carries a message made at a tick the
  kernel ran (``runs``, by boundary)."""
  if rd.remote:
    return runs & (rd.hold == 0)
  real = np.zeros_like(runs)
  for tg in rd.targets:
    real |= tg.slot.base != sinks[tg.pool]
  return runs & real


def kernel_sends(tick: Any, kid: int, branch: int, sinks: Sequence[int]
                 ) -> tuple[KernelSend, ...]:
  """The rounds kernel ``kid`` (branch ``branch`` of ``tick``) writes.

  Args:
    tick: An interp tick.
    kid: The kernel.
    branch: Its index in ``tick.branches``.
    sinks: Per pool, its sink slot.
  """
  ticks, devices = tick.branch_of.shape
  runs = np.zeros((ticks + 1, devices), bool)
  runs[1:] = tick.branch_of == branch
  mine = set(tick.out_map[kid])
  out, remote = [], -1
  for i, rd in enumerate(tick.sends):
    remote += bool(rd.remote)
    produces = _produces(rd, runs, sinks)
    if not produces.any() or not mine.intersection(rd.candidates):
      continue
    made = [(p, d, rd.candidates[rd.cand[p, d]])
            for p, d in zip(*np.nonzero(produces))]
    for p, d, port in made:
      if port not in mine:
        raise AssertionError(f"round {i} at boundary {p} on device {d} is"
                             f" not made by kernel {kid}")
    # Only the ports this kernel writes the round from: a candidate of the
    # round that is another kernel's port (or this kernel's, never sent in
    # this round) would put a select over whole payloads into the write.
    ports = tuple(sorted({port for _, _, port in made}))
    pick = np.zeros((ticks + 1, devices), np.int64)
    for p, d, port in made:
      pick[p, d] = ports.index(port)
    out.append(KernelSend(i, remote if rd.remote else -1, ports, pick))
  return tuple(out)


def writes_in_kernels(tick: Any, sinks: Sequence[int]) -> bool:
  """Whether every message of ``tick`` is written by a kernel loop: a
  round made at a tick where the device ran no kernel would be lost."""
  ticks, devices = tick.branch_of.shape
  made = np.zeros((ticks + 1, devices), bool)
  for b, kid in enumerate(tick.branches):
    if kid is None:
      continue
    runs = np.zeros((ticks + 1, devices), bool)
    runs[1:] = tick.branch_of == b
    made |= runs
  for rd in tick.sends:
    if (_produces(rd, np.ones_like(made), sinks) & ~made).any():
      return False
  return True


def sink_free(tick: Any, sends: Any) -> frozenset[int]:
  """Outbox indices (among ``tick``'s remote rounds) whose every copy by
  a kernel (``sends``: ``kid -> KernelSend``s) is a held message: no
  kernel that writes the round ever runs without making one of it, so
  the outbox needs no sink slot."""
  ticks, devices = tick.branch_of.shape
  needs, remote = set(), set()
  for b, kid in enumerate(tick.branches):
    if kid is None:
      continue
    runs = np.zeros((ticks + 1, devices), bool)
    runs[1:] = tick.branch_of == b
    for ks in sends.get(kid, ()):
      if ks.outbox < 0:
        continue
      remote.add(ks.outbox)
      if (runs & (tick.sends[ks.round].hold != 0)).any():
        needs.add(ks.outbox)
  return frozenset(remote - needs)


__all__ = ["KernelSend", "kernel_sends", "sink_free", "writes_in_kernels"]
