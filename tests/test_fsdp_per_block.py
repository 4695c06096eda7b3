"""ZeRO-3 per block (``fsdp="per_block"``, ``passes.fsdp_tick``).

FSDP parameters stay split over the data axes for the whole step; each tick
gathers the slots its kernels read and reduce-scatters their gradients into
shard-sized accumulators. Checked: loss and gradients equal
``jax.value_and_grad`` with the parameters' shardings, on ``(pipe=2,
data=2)`` and ``(pipe=2, data=2, model=2)``; in a program with loops every
FSDP all-gather runs inside a loop body (per step: none does); compiled
bytes per device are below per-step gathering where each device runs
several blocks; the predicted fixed bytes follow.
"""

from __future__ import annotations

import re
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import PartitionSpec as P

import tessel_jax as tj

from test_fsdp import DATA_MODEL, DATA_ONLY, _specs
from test_lowering_models import max_rel_err, reference, reference_infer
from test_tensor_parallel import (TOL, _batch, _mesh, _put, _spec_of,
                                  mlp_model)

WIDE_H, WIDE_F = 32, 256  # the interleaved model: parameters dominate
LAYERS_WIDE = 8  # four blocks per device
WIDE = {"up": P("data", None), "down": P(None, "data"), "b": P("data")}


def _check(step: Any, fn: Any, params: Any, specs: Any, mesh: Any,
           batch: Any, n: int) -> Any:
  """Compiles and runs ``step``; checks it against ``jax.value_and_grad``
  and the gradients' shardings; returns the compiled program."""
  sharded = _put(params, specs, mesh)
  compiled = step.lower(sharded, batch).compile()
  loss, grads = compiled(sharded, batch)
  assert max_rel_err((loss, grads), reference(fn, params, batch, n)) <= TOL
  flat = jax.tree_util.tree_leaves(specs, is_leaf=lambda x: isinstance(x, P))
  for g, s in zip(jax.tree_util.tree_leaves(grads), flat):
    assert _spec_of(g) == _spec_of(s), (g.sharding, s)
  return compiled


@pytest.mark.parametrize("mesh_shape,layer,n,ramps", [
    # interp(3) + loop(6x3) + interp(3): per block the default ("auto")
    # interprets every tick, so the loop is asked for.
    ({"pipe": 2, "data": 2}, DATA_ONLY, 16, 3),
    ({"pipe": 2, "data": 2, "model": 2}, DATA_MODEL, 2, "auto")])
def test_per_block_equals_value_and_grad(mesh_shape: dict[str, int],
                                         layer: dict[str, Any], n: int,
                                         ramps: Any) -> None:
  params, _, fn = mlp_model()
  mesh = _mesh(mesh_shape)
  step = tj.schedule(fn, mesh=mesh, placement=tj.placements.vshape(
      2, mode="train"), num_microbatches=n, plan="1f1b", data_axes=("data",),
                     fsdp="per_block", interpret_ramps=ramps)
  compiled = _check(step, fn, params, _specs(layer), mesh,
                    _batch(4 * n, False), n)
  layout = step.built.layout
  assert layout.fsdp_per_block
  text = compiled.as_text()
  if ramps != "auto":
    # The repetend gathers (once per iteration) inside its loop body.
    assert [s.kind for s in step.built.plan.segments] == [
        "interp", "loop", "interp"]
    assert any(re.search(r"all-gather(?:-start)?\(", line) and
               "tj_seg_loop/while/body" in line
               for line in text.splitlines())
  # No all-gather of a whole weight over model: only data moves.
  if "model" in mesh_shape:
    assert not re.search(r"= f32\[(16,64|64,16)\]\S* all-gather", text)
    # The placed program (``step.place``): gradients placed as the shards.
    batch = _batch(8, False)
    placed = step.place(_put(params, _specs(layer), mesh), batch)
    loss, grads = step(placed, batch)
    for a, g in zip(jax.tree_util.tree_leaves(placed),
                    jax.tree_util.tree_leaves(grads)):
      assert a.sharding.is_equivalent_to(g.sharding, a.ndim)
    assert max_rel_err((loss, step.unplace(grads)),
                       reference(fn, params, batch, 2)) <= TOL


def _wide_model() -> tuple[Any, Any]:
  """``LAYERS_WIDE`` MLP layers of width ``WIDE_F``, one block each."""
  keys = jax.random.split(jax.random.PRNGKey(0), LAYERS_WIDE)
  params = {"layers": [
      {"up": jax.random.normal(k, (WIDE_H, WIDE_F)) / np.sqrt(WIDE_H),
       "down": jax.random.normal(jax.random.fold_in(k, 1), (WIDE_F, WIDE_H))
               / np.sqrt(WIDE_F),
       "b": jnp.full((WIDE_H,), 0.01)} for k in keys]}

  def fn(params: Any, batch: Any) -> Any:
    h = batch["x"]
    for i, lp in enumerate(params["layers"]):
      h = h + jax.nn.gelu(h @ lp["up"]) @ lp["down"] + lp["b"]
      if i < LAYERS_WIDE - 1:
        h = tj.boundary(h)
    return jnp.mean((h - batch["y"]) ** 2)

  return params, fn


def wide_case() -> tuple[Any, Any, Any, Any, Any]:
  """``(params, fn, specs, mesh, batch)``: :func:`_wide_model`, every
  layer FSDP over ``data`` (``WIDE``), on (pipe=2, data=2), 8 rows."""
  params, fn = _wide_model()
  specs = {"layers": [WIDE] * LAYERS_WIDE}
  mesh = _mesh({"pipe": 2, "data": 2})
  rng = np.random.default_rng(0)
  batch = {k: jnp.asarray(rng.normal(size=(8, WIDE_H)), jnp.float32)
           for k in ("x", "y")}
  return params, fn, specs, mesh, batch


def _fsdp_gathers(text: str) -> list[str]:
  """op_names of the all-gathers whose result is a whole (gathered) weight
  of the wide model (any leading slot dimensions)."""
  out = []
  for line in text.splitlines():
    m = re.search(r"= f32\[([\d,]*)\]\S* all-gather(?:-start)?\(", line)
    if m and re.search(rf"(^|,)({WIDE_H},{WIDE_F}|{WIDE_F},{WIDE_H})$",
                       m.group(1)):
      name = re.search(r'op_name="([^"]*)"', line)
      out.append(name.group(1) if name else "")
  return out


def test_per_block_gathers_in_loops_and_holds_fewer_bytes() -> None:
  """Interleaved placement (four blocks per device), ramps interpreted: per
  block, every whole-weight all-gather sits inside a loop body and the
  compiled argument+output+temp bytes per device are below per-step
  gathering, which gathers them all before the first tick."""
  params, fn, specs, mesh, batch = wide_case()
  total, gathers, layouts = {}, {}, {}
  for mode in ("per_block", "per_step"):
    step = tj.schedule(fn, mesh=mesh, placement=tj.placements.interleaved(
        2, chunks=4, mode="train"),
                       num_microbatches=4, data_axes=("data",),
                       interpret_ramps=2, fsdp=mode)
    compiled = (_check(step, fn, params, specs, mesh, batch, 4)
                if mode == "per_block" else  # per step: tests/test_fsdp.py
                step.lower(_put(params, specs, mesh), batch).compile())
    mem = compiled.memory_analysis()
    total[mode] = (mem.argument_size_in_bytes + mem.output_size_in_bytes +
                   mem.temp_size_in_bytes)
    gathers[mode] = _fsdp_gathers(compiled.as_text())
    layouts[mode] = step.built.layout
  assert gathers["per_block"] and gathers["per_step"]
  assert all("/while/" in n for n in gathers["per_block"]), gathers
  assert not any("/while/" in n for n in gathers["per_step"]), gathers
  assert total["per_block"] < 0.85 * total["per_step"], total
  # Predicted: shards + their accumulators + optimiser slots, and the
  # largest block's parameters and gradients gathered (one layer).
  layer = (2 * WIDE_H * WIDE_F + WIDE_H) * 4
  blk, stp = layouts["per_block"], layouts["per_step"]
  assert blk.fsdp_block_bytes == (layer, layer)
  shards = 4 * layer // 2  # four layers per device, halved over data
  assert max(blk.fixed_bytes_per_device(2)) == 4 * shards + 2 * layer
  assert max(stp.fixed_bytes_per_device(2)) == 3 * shards + 2 * 4 * layer


def test_unknown_mode_is_refused() -> None:
  """An unknown ``fsdp`` mode is refused by name (``"auto"``: see
  ``tests/test_fsdp_compact.py``)."""
  _, _, fn = mlp_model()
  with pytest.raises(tj.TesselError, match=r"fsdp='zero3'; use 'per_block'"):
    tj.schedule(fn, mesh=_mesh({"pipe": 2, "data": 2}), placement="vshape",
                num_microbatches=2, plan="1f1b", data_axes=("data",),
                fsdp="zero3")


def test_per_block_over_two_data_axes_and_inference() -> None:
  """data_axes ``(data, replica)`` with ``down`` split over ``data`` only
  (its shard accumulator summed over ``replica`` at the end), and a
  forward-only program gathering per block (no gradients)."""
  params, _, fn = mlp_model()
  layer = {"up": P(("data", "replica"), None), "down": P(None, "data"),
           "b": P()}
  mesh = _mesh({"pipe": 2, "data": 2, "replica": 2})
  step = tj.schedule(fn, mesh=mesh, placement=tj.placements.vshape(
      2, mode="train"), num_microbatches=4, plan="1f1b",
                     data_axes=("data", "replica"), fsdp="per_block")
  _check(step, fn, params, _specs(layer), mesh, _batch(16, False), 4)

  def forward(params: Any, batch: Any) -> Any:
    h = batch["x"]
    for i, lp in enumerate(params["layers"]):
      h = h + jax.nn.gelu(h @ lp["up"]) @ lp["down"] + lp["b"]
      if i < len(params["layers"]) - 1:
        h = tj.boundary(h)
    return h

  mesh = _mesh({"pipe": 2, "data": 2})
  infer = tj.schedule(forward, mesh=mesh, placement=tj.placements.vshape(
      2, mode="infer"), num_microbatches=2, data_axes=("data",),
                      mode="infer", plan="gpipe", fsdp="per_block")
  batch = _batch(8, False)
  out = infer(_put(params, _specs(DATA_ONLY), mesh), batch)
  assert max_rel_err(out, reference_infer(forward, params, batch, 2)) <= TOL
  assert infer.built.layout.fsdp_per_block
