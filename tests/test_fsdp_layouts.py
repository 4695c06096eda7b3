"""One FSDP truth (``passes.packing.Layout.has_fsdp`` / ``fsdp_per_block``)
read alike by every caller, on the layouts the ``tests/test_fsdp*.py``
cases build (built, not compiled).

The callers: the ``fsdp="auto"`` choice (``tessel_jax.fsdp_choice``), the
lowering note (``tessel_jax.ramps.with_fsdp``), the program-bytes
prediction (``passes.program_bytes``), the per-block lowering
(``passes.fsdp_tick``), the priced collectives (``passes.fsdp_comm``) and
the per-slot gradient outputs (``passes.lower_program``).
"""

from __future__ import annotations

from typing import Any

import pytest
from jax.sharding import PartitionSpec as P

import tessel_jax as tj
from tessel_jax import fsdp_choice, ramps

from test_fsdp import DATA_MODEL, DATA_ONLY, _specs
from test_fsdp_compact import _limit_only_per_block_fits
from test_fsdp_per_block import wide_case
from test_tensor_parallel import _batch, _mesh, _put, mlp_model

try:  # installed: passes/ is tessel_jax.passes
  from tessel_jax.passes import fsdp_comm, fsdp_tick, program_bytes  # type: ignore
except ImportError:  # run from the repository root
  from passes import fsdp_comm, fsdp_tick, program_bytes  # type: ignore

TWO_AXES = {"up": P(("data", "replica"), None), "down": P(None, "data"),
            "b": P()}
# (mesh, layer specs (None: replicated), data axes, fsdp option, expected
# (has FSDP, per block)), as in test_fsdp.py and test_fsdp_per_block.py.
MLP_CASES = [
    ({"pipe": 2, "data": 2}, DATA_ONLY, ("data",), "auto", (True, False)),
    ({"pipe": 2, "data": 2, "model": 2}, DATA_MODEL, ("data",), "per_step",
     (True, False)),
    ({"pipe": 2, "data": 2}, DATA_ONLY, ("data",), "per_block",
     (True, True)),
    ({"pipe": 2, "data": 2, "model": 2}, DATA_MODEL, ("data",), "per_block",
     (True, True)),
    ({"pipe": 2, "data": 2, "replica": 2}, TWO_AXES, ("data", "replica"),
     "per_block", (True, True)),
    ({"pipe": 2, "data": 2}, None, ("data",), "per_block", (False, False)),
    ({"pipe": 2, "data": 2}, None, ("data",), "auto", (False, False))]


def _agree(built: Any, expected: tuple[bool, bool]) -> None:
  """Every caller reads ``built.layout`` as ``expected``."""
  layout, plan = built.layout, built.plan
  has, per_block = expected
  assert (layout.has_fsdp, layout.fsdp_per_block) == expected
  assert len(fsdp_choice.layouts("auto", layout)) == (2 if has else 1)
  note = "lowering compact"
  how = ("" if not has else "; FSDP parameters gathered " +
         ("per block" if per_block else "once per step"))
  assert ramps.with_fsdp(note, layout) == note + how
  assert program_bytes.all_gathered(layout, plan) == (has and not per_block)
  assert fsdp_tick.per_block(layout) == per_block
  assert bool(fsdp_comm.collectives(layout, plan)) == has
  assert built.lowering.per_slot_grads == (not has)


@pytest.mark.parametrize("mesh_shape,layer,data_axes,fsdp,expected",
                         MLP_CASES)
def test_callers_agree_on_the_mlp_layouts(mesh_shape: dict[str, int],
                                          layer: Any,
                                          data_axes: tuple[str, ...],
                                          fsdp: str,
                                          expected: tuple[bool, bool]) -> None:
  params, _, fn = mlp_model()
  mesh = _mesh(mesh_shape)
  step = tj.schedule(fn, mesh=mesh, placement=tj.placements.vshape(
      2, mode="train"), num_microbatches=4, plan="1f1b",
                     data_axes=data_axes, fsdp=fsdp)
  placed = params if layer is None else _put(params, _specs(layer), mesh)
  _agree(step.build(placed, _batch(16, False)), expected)


def test_callers_agree_on_the_wide_layouts_and_auto_says_why() -> None:
  """The interleaved wide model, ``"auto"``: per step without a limit and
  under a limit per step fits, per block under one only per block fits;
  the lowering note says which reason (``fsdp_choice.why``)."""
  params, fn, specs, mesh, batch = wide_case()
  placed = _put(params, specs, mesh)

  def build(limit: int | None) -> Any:
    step = tj.schedule(fn, mesh=mesh, placement=tj.placements.interleaved(
        2, chunks=4, mode="train"), num_microbatches=4, data_axes=("data",),
                       memory_limit=limit)
    step.build(placed, batch)
    return step

  tight = _limit_only_per_block_fits(build(None))
  for limit, per_block, reason in (
      (None, False, "no memory limit"),
      (1 << 30, False, "per step fits the memory limit"),
      (tight, True, "only per block fits the memory limit")):
    built = build(limit).built
    _agree(built, (True, per_block))
    assert f"(fsdp='auto': {reason}; per step " in built.report.lowering, (
        built.report.lowering)
