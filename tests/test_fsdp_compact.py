"""FSDP under the compact lowering (the default ``interpret_ramps="auto"``).

Every tick is interpreted (one table-driven loop), each kernel in its own
0/1-trip while loop; per block a kernel gathers its own FSDP leaves and
reduce-scatters its gradients inside that loop (``passes.fsdp_kernel``).
``fsdp="auto"`` gathers once per step unless only per block fits the
memory limit (``tessel_jax.fsdp_choice``; without a limit:
``test_fsdp.py``). Checked: loss and gradients equal
``jax.value_and_grad`` with the parameters' shardings; "auto" is per step
without a limit and per block under a limit only per block fits; per
block every whole-weight all-gather and every reduce-scatter sits in a
kernel's loop inside the tick loop, none before the first tick (per step:
all before it), and the compiled bytes per device are below per step's.
"""

from __future__ import annotations

import dataclasses
import re
from typing import Any

import tessel_jax as tj

from test_fsdp_per_block import WIDE_F, WIDE_H, _check, wide_case

# The interp segment is a while loop whose body holds each kernel's loop.
KERNEL_LOOP = "tj_seg_interp/while/body/while/body/"


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


def _limit_only_per_block_fits(step: Any) -> int:
  """A memory limit (bytes per device) between per block's fixed bytes
  plus ``step``'s stash peak and per step's fixed bytes."""
  built = step.built
  per_step = max(built.layout.fixed_bytes_per_device(0))
  per_block = max(dataclasses.replace(
      built.layout, fsdp_mode="per_block").fixed_bytes_per_device(0))
  stash = max(built.unrolled.peak_memory) * built.memory_unit
  assert per_block + stash < per_step, (per_block, stash, per_step)
  return (per_block + stash + per_step) // 2


def test_auto_per_block_under_a_limit_gathers_in_the_kernel_loops() -> None:
  """Interleaved placement, four blocks per device, compact,
  ``fsdp="auto"``: per step without a limit; per block under a limit only
  per block fits. Per block the gathers and reduce-scatters run in the
  kernels' loops inside the tick loop, each moves one weight (no gathered
  copy of every parameter), and the program holds fewer bytes than per
  step. Both equal ``jax.value_and_grad``."""
  params, fn, specs, mesh, batch = wide_case()
  total, text, limit = {}, {}, None
  for mode in ("per_step", "per_block"):
    step = tj.schedule(fn, mesh=mesh, placement=tj.placements.interleaved(
        2, chunks=4, mode="train"), num_microbatches=4, data_axes=("data",),
                       memory_limit=limit)
    compiled = _check(step, fn, params, specs, mesh, batch, 4)
    assert step.built.layout.fsdp_mode == mode
    assert [s.kind for s in step.built.plan.segments] == ["interp"]
    mem = compiled.memory_analysis()
    total[mode] = (mem.argument_size_in_bytes + mem.output_size_in_bytes +
                   mem.temp_size_in_bytes)
    text[mode] = compiled.as_text()
    limit = limit or _limit_only_per_block_fits(step)
  assert "(fsdp='auto': only per block fits the memory limit;" in (
      step.report.lowering)
  gathers = [c for c in _collectives(text["per_block"], "all-gather")
             if c[1].endswith("all_gather")]
  scatters = _collectives(text["per_block"], "reduce-scatter")
  assert gathers and scatters
  for dims, name in gathers + scatters:
    assert KERNEL_LOOP in name, (dims, name)
  assert all(_one_leaf(d) for d, _ in gathers), gathers
  assert any(_whole_weight(d) for d, _ in gathers), gathers
  # Per step: every slot gathered before the first tick, none in a loop.
  step_gathers = [c for c in _collectives(text["per_step"], "all-gather")
                  if _whole_weight(c[0])]
  assert step_gathers and not any("/while/" in n for _, n in step_gathers)
  assert total["per_block"] < 0.85 * total["per_step"], total
