"""``tj.schedule(interpret_ramps=...)``'s default, resolved per build
(``tessel_jax.ramps``): compact for every layout, FSDP parameters
included; explicit values win; bad values are refused by name."""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
import pytest

import tessel_jax as tj
from tessel_jax import ramps

try:  # installed: passes/ is tessel_jax.passes
  from tessel_jax.passes import packing  # type: ignore
except ImportError:  # run from the repository root
  from passes import packing  # type: ignore


def _layout(*fsdp: tuple) -> Any:
  """A ``packing.Layout`` of one-slot classes, each FSDP over the axes in
  ``fsdp`` (``()``: not FSDP)."""
  return packing.Layout(
      dtypes=(), size={}, regions={}, used={}, slot_of={}, num_devices=1,
      classes=tuple(packing.SlotClass((2,), "float32", 1, ((0,),), fsdp=f)
                    for f in fsdp))


PLAIN = _layout((), ())
FSDP = _layout((), (("data",),))


@pytest.mark.parametrize("layout,fsdp", [
    (PLAIN, "auto"), (PLAIN, "per_block"), (FSDP, "auto"),
    (FSDP, "per_block"), (FSDP, "per_step")])
def test_auto_is_compact_for_every_layout(layout, fsdp):
  # FSDP parameters included: each kernel gathers its own inside its
  # 0/1-trip loop (passes.fsdp_kernel; tests/test_fsdp_compact.py).
  got = ramps.resolve("auto", layout, fsdp)
  assert got.value == 0
  assert got.note == "lowering compact (interpret_ramps=0, auto)"


@pytest.mark.parametrize("given,name", [(0, "compact"), (8, "loops"),
                                        (2, "loops"),
                                        (None, "unrolled ramps")])
def test_an_explicit_value_wins(given, name):
  assert ramps.check(given) is None
  for layout in (PLAIN, FSDP):
    got = ramps.resolve(given, layout, "auto")
    assert got.value == given
    assert got.note == f"lowering {name} (interpret_ramps={given!r}, given)"


def test_the_note_says_how_fsdp_is_gathered():
  note = ramps.resolve(0, FSDP, "auto").note
  assert ramps.with_fsdp(note, PLAIN) == note
  assert ramps.with_fsdp(note, FSDP) == (
      f"{note}; FSDP parameters gathered once per step")
  per_block = dataclasses.replace(FSDP, fsdp_mode="per_block")
  assert ramps.with_fsdp(note, per_block) == (
      f"{note}; FSDP parameters gathered per block")


@pytest.mark.parametrize("bad", [-1, 1.5, "compact", True])
def test_bad_values_are_refused_by_name(bad):
  mesh = jax.make_mesh((2,), ("pipe",))
  with pytest.raises(tj.TesselError,
                     match=r"applied to 'f': interpret_ramps=.*; use 'auto'"):
    @tj.schedule(mesh=mesh, placement="vshape", num_microbatches=2,
                 interpret_ramps=bad)
    def f(params, batch):
      return jnp.sum(params * batch)
