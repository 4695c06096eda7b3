"""Which message rounds each device pays in an interp tick.

An interp segment (``passes.interp``) describes its messages as rounds over
the whole segment. Where every message of the segment is made by a kernel
(``passes.kernel_sends.writes_in_kernels``), the lowering writes a local
round inside the 0/1-trip loop of the kernel that made it, on the devices
running that kernel (``passes.local_writes``); a held remote round is
either copied into its outbox by every device at every boundary (a dummy
where it holds nothing) or, with ``Switches.held_in_kernels`` (on by
default since session 37), by the kernel that made it, inside its loop
(``passes.tick_runs._boundary``). Else every device writes every round at
every boundary.

:func:`kernel_rounds` says which rounds a device running a given kernel
(or none) pays at a tick; ``cost.ticks`` prices those rounds' port
operations and bytes (``interp_device_ports``, ``interp_device_traffic``):
with ``held_in_kernels``, every local round on every device (as before)
and a held remote round only on the devices of the kernel that made it;
without, every round on every device.

Why every local round, when a device writes only its own kernel's: priced
so, the record fitted on the stand-ins of the batch-norm CNN and the five
zoo models priced them within 0.85-1.10x (one process, load 7-9, capped
round medians, ``experiments.port_record_probe``'s fit); with each device
paying only its kernel's rounds (2.7-5.4x fewer round-ticks: nnx_transformer
4,600 -> 1,352, penzai_llama 3,800 -> 704) penzai_llama's stand-in came out
0.75x and the spread 0.75-1.16x (BENCHMARKS.md, helper zoo14, session 38).
What else a local round costs on the devices not writing it was not found.
The remote copies that ``held_in_kernels`` took out of the boundary (zbv11,
session 37) left the price unchanged until this module.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

try:  # installed: passes/ is tessel_jax.passes
  from tessel_jax.passes import kernel_sends as _kernel_sends  # type: ignore
except ImportError:  # run from the repository root
  from passes import kernel_sends as _kernel_sends  # type: ignore

#: Round indices a device pays, by the kernel it runs (None: idle).
Rounds = Mapping[Any, tuple[int, ...]]


def kernel_rounds(spec: Any, plan: Any, held_in_kernels: bool | None
                  ) -> Rounds | None:
  """The rounds of interp tick ``spec`` each device pays, by its kernel.

  Args:
    spec: An interp segment's table-driven tick (``plan.interps``).
    plan: The plan (its pools' sink slots).
    held_in_kernels: ``Switches.held_in_kernels`` of the lowering (held
      remote rounds copied by the kernels that made them); False or None:
      every device copies every remote round at every boundary.

  Returns:
    ``{kernel or None: round indices}``: every local round and the remote
    rounds the kernel makes; None where every device pays every round
    (without ``held_in_kernels``, or where the kernels do not write the
    segment's messages).
  """
  sinks = [p.slots for p in plan.pools]
  if not held_in_kernels or not _kernel_sends.writes_in_kernels(spec, sinks):
    return None
  local = {i for i, rd in enumerate(spec.sends) if not rd.remote}
  out: dict[Any, tuple[int, ...]] = {None: tuple(sorted(local))}
  for branch, kid in enumerate(spec.branches):
    if kid is None:
      continue
    held = {ks.round for ks in _kernel_sends.kernel_sends(
        spec, kid, branch, sinks) if ks.outbox >= 0}
    out[kid] = tuple(sorted(local | held))
  return out


def rounds_of(spec: Any, rounds: Rounds | None, kid: Any
              ) -> Sequence[Any]:
  """The rounds (``spec.sends`` entries) a device running ``kid`` pays."""
  if rounds is None:
    return spec.sends
  return [spec.sends[i] for i in rounds.get(kid, ())]
