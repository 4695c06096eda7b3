"""``tj.schedule(interpret_ramps=...)``: the lowering's default, resolved.

``interpret_ramps`` says which ticks of the plan run as one table-driven
loop over a switch of their kernels (``passes.interp``) instead of unrolled
or looped over the repetend. Its default, ``"auto"``, resolves to

* ``0`` (*compact*): every tick in one table-driven loop, remote messages
  held in outboxes until due (``passes.held``). Each kernel body is compiled
  once: the smallest program and the fastest first call (quiet peer_bench,
  2026-11-26 08:05: step 0.84/0.88x the hand-written GPipe at N = 8/32,
  first call 1.44/1.31x it, HLO 170 vs 381 kchars of the looped lowering).
  With FSDP parameters (sharded over a data axis) gathered per block
  (``fsdp="per_block"``, or ``"auto"`` where only that fits the memory
  limit, ``tessel_jax.fsdp_choice``), each kernel gathers its own leaves
  inside its 0/1-trip loop and reduce-scatters its gradients there
  (``passes.fsdp_kernel``): ZeRO-3 per block, as in the loop lowering.

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


def resolve(option: Any, layout: Any, fsdp: str) -> Ramps:
  """The ``interpret_ramps`` to lower with.

  Args:
    option: ``tj.schedule``'s ``interpret_ramps``.
    layout: The parameter layout (``passes.packing.Layout``); kept for
      the callers, the choice no longer depends on it.
    fsdp: ``tj.schedule``'s ``fsdp`` option (likewise).

  Returns:
    The value and a note naming the lowering and why it was chosen.
  """
  del layout, fsdp
  if not (isinstance(option, str) and option == AUTO):
    option = None if option is None else int(option)
    name = ("unrolled ramps" if option is None else
            "compact" if option == COMPACT else "loops")
    return Ramps(option, f"lowering {name} (interpret_ramps={option!r},"
                         f" given)")
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


__all__ = ["AUTO", "COMPACT", "LOOPS", "Ramps", "check", "resolve",
           "with_fsdp"]
