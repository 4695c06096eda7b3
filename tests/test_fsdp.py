"""FSDP (ZeRO-3) within a stage: parameters sharded over the data axes.

Megatron MLP layers pipelined over ``pipe`` with weights split over
``data`` (and ``model``): each data replica stores its shard, with
``fsdp="per_step"`` (or ``"auto"`` without a memory limit) the program
gathers it once before the first tick and
reduce-scatters its gradient after the last (per block:
``test_fsdp_per_block.py``). Checked: loss and gradients equal ``jax.value_and_grad``, the
gradients carry the parameters' shardings, the HLO reduce-scatters the FSDP
gradients over the data axes and neither all-reduces them nor gathers them
over ``model``, and the layout counts shard plus gathered buffer.
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

from test_lowering_models import max_rel_err, reference, reference_infer
from test_tensor_parallel import (H, LAYERS, TOL, _batch, _mesh, _mlp,
                                  _mlp_params, _put, _spec_of, mlp_model)

F = 64
DATA_ONLY = {"up": P("data", None), "down": P(None, "data"), "b": P("data")}
DATA_MODEL = {"up": P("data", "model"), "down": P("model", "data"),
              "b": P()}


def _specs(layer: dict[str, Any]) -> dict[str, Any]:
  return {"layers": [layer] * LAYERS}


def _collectives(text: str, op: str) -> list[tuple[tuple[int, ...], str]]:
  """``(result shape, op_name)`` of every ``op`` in the HLO text (tuple
  results: each element)."""
  out = []
  for line in text.splitlines():
    m = re.search(rf"= (\(.*?\)|\S+) {op}(?:-start)?\(", line)
    if not m:
      continue
    name = re.search(r'op_name="([^"]*)"', line)
    for dims in re.findall(r"f32\[([\d,]*)\]", m.group(1)):
      shape = tuple(int(d) for d in dims.split(",") if d)
      out.append((shape, name.group(1) if name else ""))
  return out


def _run(mesh_shape: dict[str, int], layer: dict[str, Any],
         data_axes: tuple[str, ...] = ("data",), n: int = 2,
         fsdp: str = "per_step") -> tuple[Any, str, Any]:
  """Runs the pipelined MLP with weights placed by ``layer``, compiled once;
  checks it against ``jax.value_and_grad`` and the gradients' shardings;
  returns the step, the compiled HLO text and the gradients."""
  params, _, fn = mlp_model()
  mesh = _mesh(mesh_shape)
  sharded = _put(params, _specs(layer), mesh)
  batch = _batch(4 * n, False)
  step = tj.schedule(fn, mesh=mesh, placement=tj.placements.vshape(
      2, mode="train"), num_microbatches=n, plan="1f1b", data_axes=data_axes,
                     fsdp=fsdp)
  compiled = step.lower(sharded, batch).compile()
  loss, grads = compiled(sharded, batch)
  assert max_rel_err((loss, grads), reference(fn, params, batch, n)) <= TOL
  text = compiled.as_text()
  flat_specs = jax.tree_util.tree_leaves(
      _specs(layer), is_leaf=lambda x: isinstance(x, P))
  for g, s in zip(jax.tree_util.tree_leaves(grads), flat_specs):
    assert _spec_of(g) == _spec_of(s), (g.sharding, s)
  return step, text, grads


@pytest.mark.parametrize("mesh_shape,layer,fsdp", [
    # "auto" (the default) without a memory limit: per step
    # (tessel_jax.fsdp_choice; under a limit: test_fsdp_compact.py).
    ({"pipe": 2, "data": 2}, DATA_ONLY, "auto"),
    ({"pipe": 2, "data": 2, "model": 2}, DATA_MODEL, "per_step")])
def test_fsdp_equals_value_and_grad(mesh_shape: dict[str, int],
                                    layer: dict[str, Any], fsdp: str) -> None:
  step, text, _ = _run(mesh_shape, layer, fsdp=fsdp)
  assert step.built.layout.fsdp_mode == "per_step"
  if fsdp == "auto":
    assert re.fullmatch(
        r"lowering compact \(interpret_ramps=0, auto\); FSDP parameters"
        r" gathered once per step \(fsdp='auto': no memory limit; per step"
        r" [\d.]+ MiB fixed per device and \d+ FSDP collectives, per block"
        r" [\d.]+ MiB and \d+\)", step.report.lowering), step.report.lowering
  model = mesh_shape.get("model", 1)
  # Per device: the weight stored split over data (and model), gathered
  # over data only.
  stored = {(H // 2, F // model), (F // model, H // 2)}
  gathered = {(H, F // model), (F // model, H)}
  # Slot gradients (1, slots, *leaf): the weights' come back as shards.
  scatters = [(s[2:], n) for s, n in _collectives(text, "reduce-scatter")
              if len(s) == 4]
  assert sorted(s for s, _ in scatters) == sorted(stored), scatters
  reduced = [s[-2:] for s, _ in _collectives(text, "all-reduce")]
  assert not gathered & set(reduced), reduced
  assert not {(H, F), (F, H)} & set(reduced)
  gathers = [(s[-2:], n) for s, n in _collectives(text, "all-gather")
             if len(s) >= 2]
  fsdp_gathers = [(s, n) for s, n in gathers if s in gathered]
  assert sorted(s for s, _ in fsdp_gathers) == sorted(gathered), gathers
  # Once per step, outside every switch branch and loop.
  for _, name in fsdp_gathers + scatters:
    assert "/cond/" not in name and "/while/" not in name, name
  gathers = [s for s, _ in gathers]
  assert not {(H, F), (F, H)} & set(gathers) or model == 1
  layout = step.built.layout
  fsdp = [c for c in layout.classes if c.fsdp]
  assert len(fsdp) == (3 if model == 1 else 2)
  for c in fsdp:
    assert c.data_parts == 2 and c.parts == 2 * model
    assert c.gathered_nbytes == c.nbytes // model == 2 * c.device_nbytes
  # Both weights of a layer: shard + gathered buffer, on one device.
  weights = 2 * H * F * 4 // model
  bias = H * 4 if model > 1 else H * 4 // 2 + H * 4
  assert max(layout.bytes_per_device()) == weights // 2 + weights + bias


def test_fsdp_over_two_data_axes_with_an_unnamed_one() -> None:
  """data_axes ``(data, replica)``; weights split over ``(data, replica)``
  or ``data`` only: the latter is summed over ``replica``, reduce-scattered
  over ``data``."""
  layer = {"up": P(("data", "replica"), None), "down": P(None, "data"),
           "b": P()}
  _, text, _ = _run({"pipe": 2, "data": 2, "replica": 2}, layer,
                    data_axes=("data", "replica"), n=4)
  scattered = sorted(s[2:] for s, _ in _collectives(text, "reduce-scatter")
                     if len(s) == 4)
  assert scattered == sorted([(F, H // 2), (H // 4, F)]), scattered


def test_fsdp_via_param_sharding_and_inference() -> None:
  """``param_sharding=`` on unplaced arrays, and a forward-only program
  (gathered weights, no gradients)."""
  params, _, fn = mlp_model()
  mesh = _mesh({"pipe": 2, "data": 2, "model": 2})
  batch = _batch(8, False)
  step = tj.schedule(fn, mesh=mesh, placement=tj.placements.vshape(
      2, mode="train"), num_microbatches=2, plan="1f1b", data_axes=("data",),
                     param_sharding=_specs(DATA_MODEL))
  loss, grads = step(params, batch)
  assert max_rel_err((loss, grads), reference(fn, params, batch, 2)) <= TOL
  assert _spec_of(grads["layers"][1]["down"]) == ("model", "data")

  def forward(params: Any, batch: Any) -> Any:
    h = batch["x"]
    for i, lp in enumerate(params["layers"]):
      h = _mlp(lp, h)
      if i < LAYERS - 1:
        h = tj.boundary(h)
    return h

  infer = tj.schedule(forward, mesh=mesh, placement=tj.placements.vshape(
      2, mode="infer"), num_microbatches=2, data_axes=("data",),
                      mode="infer", plan="gpipe")
  out = infer(_put(params, _specs(DATA_MODEL), mesh), batch)
  assert max_rel_err(out, reference_infer(forward, params, batch, 2)) <= TOL


def test_fixed_bytes_count_shard_and_gathered_buffers() -> None:
  """With FSDP the parameters' fixed memory (parameters, accumulators,
  optimiser slots) is shard x (1 + slots) + 2 x gathered, below the
  replicated layout's (2 + slots) x whole."""
  params, _, fn = mlp_model()
  mesh = _mesh({"pipe": 2, "data": 2})
  batch = _batch(8, False)
  built = {}
  for name, specs in (("fsdp", _specs(DATA_ONLY)), ("replicated", None)):
    step = tj.schedule(fn, mesh=mesh, placement=tj.placements.vshape(
        2, mode="train"), num_microbatches=2, plan="1f1b",
                       data_axes=("data",), param_sharding=specs,
                       fsdp="per_step")
    built[name] = step.build(params, batch).layout
  layer = (2 * H * F + H) * 4
  assert max(built["replicated"].fixed_bytes_per_device(2)) == 4 * layer
  assert max(built["fsdp"].fixed_bytes_per_device(2)) == (
      3 * layer // 2 + 2 * layer)


def test_gspmd_axis_before_data_axis_is_refused() -> None:
  params, _, fn = mlp_model()
  mesh = _mesh({"pipe": 2, "data": 2, "model": 2})
  specs = _specs({"up": P(("model", "data"), None), "down": P(),
                  "b": P()})
  step = tj.schedule(fn, mesh=mesh, placement="vshape", num_microbatches=4,
                     plan="1f1b", data_axes=("data",), param_sharding=specs)
  with pytest.raises(tj.TesselError, match=r"\['layers'\]\[0\]\['up'\].*"
                     r"GSPMD axis before a data axis; list the data axes"
                     r" first \(\('data', 'model'\)\)"):
    step(params, _batch(16, False))


def test_data_split_that_does_not_divide_is_refused() -> None:
  params, _, fn = mlp_model()
  params["layers"][0]["b"] = np.ones((3,), np.float32)
  mesh = _mesh({"pipe": 2, "data": 2})
  specs = _specs({"up": P(), "down": P(), "b": P("data")})
  step = tj.schedule(fn, mesh=mesh, placement="vshape", num_microbatches=4,
                     plan="1f1b", data_axes=("data",), param_sharding=specs)
  with pytest.raises(tj.TesselError, match=r"\['b'\] of shape \(3,\).*"
                     r"into 2 pieces over \('data',\), which does not"
                     r" divide; pad it"):
    step(params, _batch(16, False))


def test_fsdp_with_two_blocks_per_device_and_interpreted_ramps() -> None:
  """Interleaved placement: two FSDP slots per class on every device, ramps
  run as table-driven loops (``interpret_ramps``)."""
  keys = jax.random.split(jax.random.PRNGKey(0), 4)
  params = {"layers": [_mlp_params(k) for k in keys]}
  layer = {"up": P("data", "model"), "down": P("model", "data"),
           "b": P("data")}
  specs = {"layers": [layer] * 4}

  def fn(params: Any, batch: Any) -> Any:
    h = batch["x"]
    for i, lp in enumerate(params["layers"]):
      h = _mlp(lp, h)
      if i < 3:
        h = tj.boundary(h)
    return jnp.mean((h - batch["y"]) ** 2)

  mesh = _mesh({"pipe": 2, "data": 2, "model": 2})
  batch = _batch(16, False)
  step = tj.schedule(fn, mesh=mesh, placement="interleaved",
                     num_microbatches=4, data_axes=("data",),
                     interpret_ramps=2)
  loss, grads = step(_put(params, specs, mesh), batch)
  assert max_rel_err((loss, grads), reference(fn, params, batch, 4)) <= TOL
  assert _spec_of(grads["layers"][3]["b"]) == ("data",)
  assert [c.count for c in step.built.layout.classes if c.fsdp] == [2, 2, 2]


def test_scanned_stack_keeps_its_sharding() -> None:
  """A ``lax.scan`` over stacked layers cut automatically: sharded stacks
  are stored whole (not as per-block slices), so each spec stays on its
  leaf and the gradients come back with it."""
  keys = jax.random.split(jax.random.PRNGKey(0), 2)
  params = {"up": jax.random.normal(keys[0], (4, H, F)) / np.sqrt(H),
            "down": jax.random.normal(keys[1], (4, F, H)) / np.sqrt(F)}
  specs = {"up": P(None, "data", "model"), "down": P(None, "model", "data")}

  def fn(params: Any, batch: Any) -> Any:
    def layer(h: Any, lp: Any) -> tuple[Any, None]:
      return h + jax.nn.gelu(h @ lp["up"]) @ lp["down"], None
    h, _ = jax.lax.scan(layer, batch["x"], params)
    return jnp.mean((h - batch["y"]) ** 2)

  mesh = _mesh({"pipe": 2, "data": 2, "model": 2})
  batch = _batch(16, False)
  step = tj.schedule(fn, mesh=mesh, placement="vshape", num_microbatches=4,
                     data_axes=("data",), cut="auto", plan="1f1b")
  loss, grads = step(_put(params, specs, mesh), batch)
  assert max_rel_err((loss, grads), reference(fn, params, batch, 4)) <= TOL
  assert _spec_of(grads["up"]) == (None, "data", "model")
  assert _spec_of(grads["down"]) == (None, "model", "data")
