"""``tj.schedule(interpret_ramps=...)``: the lowering's default, resolved.

``interpret_ramps`` says which ticks of the plan run as one table-driven
loop over a switch of their kernels (``passes.interp``) instead of unrolled
or looped over the repetend. Its default, ``"auto"``, resolves by the
mesh's platform:

* CPU and TPU: ``0`` (*compact*): every tick in one table-driven loop,
  remote messages held in outboxes until due (``passes.held``). Each kernel
  body is compiled once: the smallest program and the fastest first call
  (quiet peer_bench, 2026-11-26 08:05: step 0.84/0.88x the hand-written
  GPipe at N = 8/32, first call 1.44/1.31x it, HLO 170 vs 381 kchars of
  the looped lowering). With FSDP parameters (sharded over a data axis)
  gathered per block (``fsdp="per_block"``, or ``"auto"`` where only that
  fits the memory limit, ``tessel_jax.fsdp_choice``), each kernel gathers
  its own leaves inside its 0/1-trip loop and reduce-scatters its
  gradients there (``passes.fsdp_kernel``): ZeRO-3 per block, as in the
  loop lowering. (TPU: not measured; its loop predicates stay on the
  chip.)
* GPU (``cuda``, ``rocm``, ``gpu``): None (*loops, every ramp unrolled*).
  XLA's GPU runtime reads every ``while`` predicate back to the host, one
  synchronisation per iteration, and the compact tick runs each kernel in
  a 0/1-trip loop: on one H200 (jax 0.11.2, 2026-11-27,
  ``experiments.device_ticks``) a compact tick cost 390-510 us more than
  the same kernels in a ``lax.scan``, the loop form's 9-13 us; the MLP's
  step 27.2 against 2.7 ms at N = 8 and 126 against 8.2 ms at N = 32.

An explicit value is used as given: ``0`` is the compact lowering; an
integer ``k > 0`` the *loop* lowering (the repetend runs as a ``fori_loop``
unrolling one period, straight-line stretches such as warmup and cooldown
of at least ``k`` ticks are interpreted, shorter ones unrolled as pruned
ticks; pass 8 to compare with the compact one); None: loops, every ramp
unrolled. ``step.report.lowering`` says which lowering was built, why, and
how FSDP parameters are gathered (``with_fsdp``).
"""

from __future__ import annotations

import dataclasses
import numbers
from typing import Any

AUTO = "auto"
COMPACT = 0  # every tick in one table-driven loop
LOOPS = 8    # ramps of at least 8 ticks interpreted, the repetend looped


@dataclasses.dataclass(frozen=True)
class Ramps:
  """A resolved ``interpret_ramps``.

  Attributes:
    value: What ``passes.plan.build_plan`` gets (None: unroll the ramps).
    note: Which lowering it is and why, for ``step.report``.
  """

  value: int | None
  note: str


def check(option: Any) -> str | None:
  """What is wrong with ``option`` (None: nothing)."""
  if option is None or option == AUTO:
    return None
  if (isinstance(option, bool) or
      not isinstance(option, numbers.Integral) or option < 0):
    return (f"interpret_ramps={option!r}; use 'auto' (the default: the"
            f" compact lowering, 0), an integer >= 0 (0: every tick in one"
            f" table-driven loop; k: ramps of at least k ticks interpreted,"
            f" the repetend looped) or None (unroll every ramp)")
  return None


#: Platforms whose ``while`` predicates go back to the host each iteration.
HOST_PREDICATE_PLATFORMS = frozenset({"gpu", "cuda", "rocm"})


def resolve(option: Any, platform: str = "cpu") -> Ramps:
  """The ``interpret_ramps`` to lower with.

  Args:
    option: ``tj.schedule``'s ``interpret_ramps``.
    platform: The mesh's devices' platform (``jax.Device.platform``):
      ``"auto"`` is the compact lowering on CPU and TPU, loops with every
      ramp unrolled on GPU (see the module docstring).

  Returns:
    The value and a note naming the lowering and why it was chosen.
  """
  if not (isinstance(option, str) and option == AUTO):
    option = None if option is None else int(option)
    name = ("unrolled ramps" if option is None else
            "compact" if option == COMPACT else "loops")
    return Ramps(option, f"lowering {name} (interpret_ramps={option!r},"
                         f" given)")
  if platform.lower() in HOST_PREDICATE_PLATFORMS:
    return Ramps(None, f"lowering unrolled ramps (interpret_ramps=None,"
                       f" auto on {platform}: each loop predicate is a"
                       f" host synchronisation there)")
  return Ramps(COMPACT, f"lowering compact (interpret_ramps={COMPACT},"
                        f" auto)")


def with_fsdp(note: str, layout: Any, why: str = "") -> str:
  """``note`` plus how the built layout gathers its FSDP parameters (per
  block or once per step) and ``why`` (``tessel_jax.fsdp_choice.why``)."""
  if not layout.has_fsdp:
    return note
  how = "per block" if layout.fsdp_per_block else "once per step"
  return f"{note}; FSDP parameters gathered {how}" + (
      f" ({why})" if why else "")


__all__ = ["AUTO", "COMPACT", "HOST_PREDICATE_PLATFORMS", "LOOPS", "Ramps",
           "check", "resolve", "with_fsdp"]
