"""``fsdp="auto"`` (``tessel_jax.fsdp_choice``) without devices: which
layouts the search tries, in what order, and which it keeps. Built
programs: ``tests/test_fsdp_compact.py``."""

from __future__ import annotations

from typing import Any

import pytest

from tessel_jax import fsdp_choice, step_schedule

try:  # installed: passes/ is tessel_jax.passes
  from tessel_jax.passes import packing  # type: ignore
except ImportError:  # run from the repository root
  from passes import packing  # type: ignore


def _layout(classes: tuple = ((), (("data",),)),
            fsdp_mode: str = "per_step") -> Any:
  """A ``packing.Layout`` of one-slot classes, each FSDP over the axes
  in ``classes`` (``()``: not FSDP)."""
  return packing.Layout(
      dtypes=(), size={}, regions={}, used={}, slot_of={}, num_devices=1,
      classes=tuple(packing.SlotClass((2,), "float32", 1, ((0,),), fsdp=f)
                    for f in classes), fsdp_mode=fsdp_mode)


def test_auto_tries_per_step_then_per_block() -> None:
  tried = fsdp_choice.layouts("auto", _layout())
  assert [l.fsdp_mode for l in tried] == ["per_step", "per_block"]
  plain = _layout(classes=((),))
  assert fsdp_choice.layouts("auto", plain) == (plain,)
  for mode in ("per_step", "per_block"):
    given = _layout(fsdp_mode=mode)
    assert fsdp_choice.layouts(mode, given) == (given,)


def _finder(results: dict[str, Any]) -> Any:
  """find(layout): ``results[mode]`` is ``fits`` or an exception."""
  def find(layout: Any) -> tuple[Any, Any, bool]:
    got = results[layout.fsdp_mode]
    if isinstance(got, Exception):
      raise got
    return f"schedule {layout.fsdp_mode}", got
  return find


@pytest.mark.parametrize("results,kept", [
    ({"per_step": True, "per_block": True}, "per_step"),
    # a searched schedule: per step infeasible under the limit
    ({"per_step": step_schedule.InfeasibleMemory("x"), "per_block": True},
     "per_block"),
    # a given plan: found in both, its stash over the limit per step only
    ({"per_step": False, "per_block": True}, "per_block"),
    # over the limit in both: the first found (per step), as before
    ({"per_step": False, "per_block": False}, "per_step"),
    ({"per_step": step_schedule.InfeasibleMemory("x"), "per_block": False},
     "per_block")])
def test_the_first_fitting_layout_is_kept(results: dict, kept: str) -> None:
  layout, schedule = fsdp_choice.first_fitting(
      fsdp_choice.layouts("auto", _layout()), _finder(results))
  assert layout.fsdp_mode == kept and schedule == f"schedule {kept}"


def test_no_schedule_in_any_layout_raises_the_last_error() -> None:
  last = step_schedule.InfeasibleMemory("per block too")
  with pytest.raises(step_schedule.InfeasibleMemory, match="per block too"):
    fsdp_choice.first_fitting(
        fsdp_choice.layouts("auto", _layout()),
        _finder({"per_step": step_schedule.InfeasibleMemory("per step"),
                 "per_block": last}))
