"""FSDP under the compact lowering (the default ``interpret_ramps="auto"``).

Every tick is interpreted (one table-driven loop), each kernel in its own
0/1-trip while loop; per block (``fsdp="auto"``) a kernel gathers its own
FSDP leaves and reduce-scatters its gradients inside that loop
(``passes.fsdp_kernel``). Checked: loss and gradients equal
``jax.value_and_grad`` with the parameters' shardings for ``fsdp="auto"``
and ``"per_step"``; per block every whole-weight all-gather and every
reduce-scatter sits in a kernel's loop inside the tick loop, none before
the first tick (per step: all before it), and the compiled bytes per
device are below per step's, near the shards plus one block gathered.
"""

from __future__ import annotations

import re

import pytest

import tessel_jax as tj

from test_fsdp import DATA_ONLY, _specs
from test_fsdp_per_block import WIDE_F, WIDE_H, _check, wide_case
from test_tensor_parallel import _batch, _mesh, mlp_model

KERNEL_LOOP = "tj_seg_interp/while/body/closed_call/while/body/"


@pytest.mark.parametrize("fsdp,how", [("auto", "per block"),
                                      ("per_step", "once per step")])
def test_compact_fsdp_equals_value_and_grad(fsdp: str, how: str) -> None:
  params, _, fn = mlp_model()
  mesh = _mesh({"pipe": 2, "data": 2})
  step = tj.schedule(fn, mesh=mesh, placement=tj.placements.vshape(
      2, mode="train"), num_microbatches=4, plan="1f1b", data_axes=("data",),
                     fsdp=fsdp)
  _check(step, fn, params, _specs(DATA_ONLY), mesh, _batch(16, False), 4)
  built = step.built
  assert [s.kind for s in built.plan.segments] == ["interp"]
  assert built.report.lowering == (
      f"lowering compact (interpret_ramps=0, auto); FSDP parameters"
      f" gathered {how}")


def _collectives(text: str, op: str) -> list[tuple[str, str]]:
  """``(result dims, op_name)`` of every ``op`` in the HLO text."""
  out = []
  for line in text.splitlines():
    m = re.search(rf"= f32\[([\d,]*)\]\S* {op}(?:-start)?\(", line)
    if m:
      name = re.search(r'op_name="([^"]*)"', line)
      out.append((m.group(1), name.group(1) if name else ""))
  return out


def _whole_weight(dims: str) -> bool:
  """A result holding one whole weight matrix of the wide model."""
  return bool(re.search(rf"(^|,)({WIDE_H},{WIDE_F}|{WIDE_F},{WIDE_H})$",
                        dims))


def _one_leaf(dims: str) -> bool:
  """A result holding one whole leaf of the wide model (a weight or a
  bias) behind unit dimensions: not a stack of several."""
  shape = tuple(int(d) for d in dims.split(","))
  leaves = ((WIDE_H, WIDE_F), (WIDE_F, WIDE_H), (WIDE_H,))
  return any(shape[-len(s):] == s and all(d == 1 for d in shape[:-len(s)])
             for s in leaves)


def test_compact_per_block_gathers_in_the_kernel_loops() -> None:
  """Interleaved placement, four blocks per device, compact: per block the
  gathers and reduce-scatters run in the kernels' loops inside the tick
  loop, each moves one weight (no gathered copy of every parameter), and
  the program holds fewer bytes than per step."""
  params, fn, specs, mesh, batch = wide_case()
  total, text = {}, {}
  for mode in ("auto", "per_step"):
    step = tj.schedule(fn, mesh=mesh, placement=tj.placements.interleaved(
        2, chunks=4, mode="train"), num_microbatches=4, data_axes=("data",),
                       fsdp=mode)
    compiled = _check(step, fn, params, specs, mesh, batch, 4)
    assert [s.kind for s in step.built.plan.segments] == ["interp"]
    mem = compiled.memory_analysis()
    total[mode] = (mem.argument_size_in_bytes + mem.output_size_in_bytes +
                   mem.temp_size_in_bytes)
    text[mode] = compiled.as_text()
  gathers = [c for c in _collectives(text["auto"], "all-gather")
             if c[1].endswith("all_gather")]
  scatters = _collectives(text["auto"], "reduce-scatter")
  assert gathers and scatters
  for dims, name in gathers + scatters:
    assert KERNEL_LOOP in name, (dims, name)
  assert all(_one_leaf(d) for d, _ in gathers), gathers
  assert any(_whole_weight(d) for d, _ in gathers), gathers
  # Per step: every slot gathered before the first tick, none in a loop.
  step_gathers = [c for c in _collectives(text["per_step"], "all-gather")
                  if _whole_weight(c[0])]
  assert step_gathers and not any("/while/" in n for _, n in step_gathers)
  assert total["auto"] < 0.85 * total["per_step"], total
