"""``tj.schedule(interpret_ramps=...)``'s default, resolved per build
(``tessel_jax.ramps``): compact on CPU and TPU, loops with every ramp
unrolled on GPU (each loop predicate is a host synchronisation there);
explicit values win on every platform; bad values are refused by name."""

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


@pytest.mark.parametrize("platform", ["cpu", "tpu"])
def test_auto_is_compact_on_cpu_and_tpu(platform):
  # FSDP parameters included: each kernel gathers its own inside its
  # 0/1-trip loop (passes.fsdp_kernel; tests/test_fsdp_compact.py).
  got = ramps.resolve("auto", platform)
  assert got.value == 0
  assert got.note == "lowering compact (interpret_ramps=0, auto)"


@pytest.mark.parametrize("platform", ["gpu", "cuda", "rocm", "CUDA"])
def test_auto_unrolls_the_ramps_on_gpu(platform):
  # experiments.device_ticks on one H200: a compact tick cost 390-510 us
  # over a lax.scan of the same kernels, the loop form's 9-13 us.
  got = ramps.resolve("auto", platform)
  assert got.value is None
  assert got.note.startswith("lowering unrolled ramps (interpret_ramps=None,"
                             f" auto on {platform}")


@pytest.mark.parametrize("given,name", [(0, "compact"), (8, "loops"),
                                        (2, "loops"),
                                        (None, "unrolled ramps")])
@pytest.mark.parametrize("platform", ["cpu", "gpu"])
def test_an_explicit_value_wins(given, name, platform):
  assert ramps.check(given) is None
  got = ramps.resolve(given, platform)
  assert got.value == given
  assert got.note == f"lowering {name} (interpret_ramps={given!r}, given)"


def test_a_build_resolves_by_its_mesh_platform(monkeypatch):
  seen = []
  resolve = ramps.resolve

  def spy(option, platform="cpu"):
    seen.append(platform)
    return resolve(option, platform)

  monkeypatch.setattr(ramps, "resolve", spy)
  mesh = jax.make_mesh((2,), ("pipe",))
  step = tj.schedule(lambda p, b: jnp.sum(jnp.tanh(b @ p[0]) @ p[1]),
                     mesh=mesh, placement="vshape", num_microbatches=2,
                     cut="auto")
  params = [jnp.ones((4, 4)), jnp.ones((4, 4))]
  step(params, jnp.ones((4, 4)))
  assert seen == [mesh.devices.flat[0].platform] == ["cpu"]
  assert step.report.lowering.startswith("lowering compact")


def test_the_note_says_how_fsdp_is_gathered():
  note = ramps.resolve(0).note
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
