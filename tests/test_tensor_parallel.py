"""Pipeline x tensor x data: mesh axes left to GSPMD inside the blocks.

Megatron-style MLP and attention layers (``up``/``q``/``k``/``v`` split
over ``model`` along their output features, ``down``/``out`` along their
input features) pipelined over ``pipe`` on meshes ``(pipe=2, model=2)`` and
``(pipe=2, data=2, model=2)``: loss and gradients equal
``jax.value_and_grad``, the gradients carry the parameters' shardings, each
device stores its shard of every split weight, and the compiled HLO holds
the tensor-parallel all-reduces and no all-gather of a whole split weight.
"""

from __future__ import annotations

import re
import warnings
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import AxisType, NamedSharding
from jax.sharding import PartitionSpec as P

import tessel_jax as tj
from tessel_jax import compat

from test_lowering_models import max_rel_err, reference, reference_infer

TOL = 1e-5
H = 16  # hidden
F = 64  # MLP inner width (split over model)
HEADS = 4
SEQ = 4
LAYERS = 2
MLP_SPECS = {"up": P(None, "model"), "down": P("model", None), "b": P()}
ATTN_SPECS = {"q": P(None, "model"), "k": P(None, "model"),
              "v": P(None, "model"), "out": P("model", None)}


def _mesh(shape: dict[str, int], axis_type: Any = AxisType.Auto) -> Any:
  return jax.make_mesh(tuple(shape.values()), tuple(shape),
                       axis_types=(axis_type,) * len(shape),
                       devices=jax.devices()[:int(np.prod(list(
                           shape.values())))])


def _mlp_params(key: Any) -> dict[str, Any]:
  k1, k2 = jax.random.split(key)
  return {"up": jax.random.normal(k1, (H, F)) / np.sqrt(H),
          "down": jax.random.normal(k2, (F, H)) / np.sqrt(F),
          "b": jnp.full((H,), 0.01)}


def _attn_params(key: Any) -> dict[str, Any]:
  ks = jax.random.split(key, 4)
  return {n: jax.random.normal(k, (H, H)) / np.sqrt(H)
          for n, k in zip(("q", "k", "v", "out"), ks)}


def _mlp(p: Any, h: Any) -> Any:
  return h + jax.nn.gelu(h @ p["up"]) @ p["down"] + p["b"]


def _attn(p: Any, h: Any) -> Any:
  b, s, _ = h.shape
  heads = lambda x: x.reshape(b, s, HEADS, H // HEADS)
  q, k, v = (heads(h @ p[n]) for n in ("q", "k", "v"))
  w = jax.nn.softmax(jnp.einsum("bqhd,bkhd->bhqk", q, k) / np.sqrt(H // HEADS))
  o = jnp.einsum("bhqk,bkhd->bqhd", w, v).reshape(b, s, H)
  return h + o @ p["out"]


def mlp_model() -> tuple[Any, Any, Any]:
  """(params, specs, fn): LAYERS Megatron MLP layers, one block each."""
  keys = jax.random.split(jax.random.PRNGKey(0), LAYERS)
  params = {"layers": [_mlp_params(k) for k in keys]}
  specs = {"layers": [MLP_SPECS] * LAYERS}

  def fn(params: Any, batch: Any) -> Any:
    h = batch["x"]
    for i, lp in enumerate(params["layers"]):
      h = _mlp(lp, h)
      if i < LAYERS - 1:
        h = tj.boundary(h)
    return jnp.mean((h - batch["y"]) ** 2)

  return params, specs, fn


def attn_model() -> tuple[Any, Any, Any]:
  """(params, specs, fn): attention + MLP per layer, one block per layer."""
  keys = jax.random.split(jax.random.PRNGKey(1), 2 * LAYERS)
  params = {"layers": [{"attn": _attn_params(keys[2 * i]),
                        "mlp": _mlp_params(keys[2 * i + 1])}
                       for i in range(LAYERS)]}
  specs = {"layers": [{"attn": ATTN_SPECS, "mlp": MLP_SPECS}] * LAYERS}

  def fn(params: Any, batch: Any) -> Any:
    h = batch["x"]
    for i, lp in enumerate(params["layers"]):
      h = _mlp(lp["mlp"], _attn(lp["attn"], h))
      if i < LAYERS - 1:
        h = tj.boundary(h)
    return jnp.mean((h - batch["y"]) ** 2)

  return params, specs, fn


def _batch(rows: int, seq: bool) -> dict[str, Any]:
  rng = np.random.default_rng(0)
  shape = (rows, SEQ, H) if seq else (rows, H)
  return {"x": jnp.asarray(rng.normal(size=shape), jnp.float32),
          "y": jnp.asarray(rng.normal(size=shape), jnp.float32)}


def _put(params: Any, specs: Any, mesh: Any) -> Any:
  return jax.tree_util.tree_map(
      lambda x, s: jax.device_put(x, NamedSharding(mesh, s)), params, specs,
      is_leaf=lambda x: isinstance(x, P))


def _spec_of(x: Any) -> tuple[Any, ...]:
  """A sharding's (or a PartitionSpec's) entries without trailing Nones."""
  spec = tuple(x if isinstance(x, P) else x.sharding.spec)
  while spec and spec[-1] is None:
    spec = spec[:-1]
  return spec


def _block_all_reduces(text: str) -> int:
  """All-reduces the partitioner put inside the program's kernels (their
  name scope, ``passes.lower.SCOPES["kernel"]``; the default compact
  lowering runs them in loops, not ``cond`` branches)."""
  return sum(1 for line in text.splitlines()
             if re.search(r"= \S+ all-reduce(?:-start)?\(", line)
             and "shard_map/" in line and "/tj_kernel/" in line)


def _gathered_weights(text: str, params: Any) -> list[str]:
  """All-gathers whose result has the full shape of a 2-D weight."""
  shapes = {tuple(x.shape) for x in jax.tree_util.tree_leaves(params)
            if x.ndim == 2}
  found = []
  for line in text.splitlines():
    m = re.search(r"= f32\[([\d,]*)\]\S* all-gather", line)
    if m and tuple(int(d) for d in m.group(1).split(",") if d) in shapes:
      found.append(line.strip()[:120])
  return found


def _run(model: Any, seq: bool, mesh_shape: dict[str, int],
         data_axes: Any = ("data",), n: int = 2) -> tuple[Any, str, Any]:
  """Runs the pipelined model once (compiled once), checks it against
  ``jax.value_and_grad``; returns the step, the compiled HLO text and the
  gradients."""
  params, specs, fn = model()
  mesh = _mesh(mesh_shape)
  if "data" not in mesh_shape:
    data_axes = ()
  sharded = _put(params, specs, mesh)
  batch = _batch(4 * n, seq)
  step = tj.schedule(fn, mesh=mesh, placement=tj.placements.vshape(
      2, mode="train"), num_microbatches=n, plan="1f1b", data_axes=data_axes)
  compiled = step.lower(sharded, batch).compile()
  loss, grads = compiled(sharded, batch)
  ref_loss, ref_grads = reference(fn, params, batch, n)
  assert max_rel_err(loss, ref_loss) <= TOL
  assert max_rel_err(grads, ref_grads) <= TOL
  return step, compiled.as_text(), grads


@pytest.mark.parametrize("mesh_shape", [{"pipe": 2, "model": 2},
                                        {"pipe": 2, "data": 2, "model": 2}])
@pytest.mark.parametrize("model,seq", [(mlp_model, False),
                                       (attn_model, True)])
def test_megatron_equals_value_and_grad(model: Any, seq: bool,
                                        mesh_shape: dict[str, int]) -> None:
  step, text, grads = _run(model, seq, mesh_shape)
  params, specs, _ = model()
  flat_specs = jax.tree_util.tree_leaves(
      specs, is_leaf=lambda x: isinstance(x, P))
  for g, s in zip(jax.tree_util.tree_leaves(grads), flat_specs):
    assert _spec_of(g) == _spec_of(s), (g.sharding, s)
  # One per row-split matmul: every forward, every backward but the first
  # (which needs no gradient of its input).
  assert _block_all_reduces(text) >= 2 * LAYERS - 1
  assert not _gathered_weights(text, params)
  # Every split weight is stored as one shard per device.
  layout = step.built.layout
  split = [c for c in layout.classes if c.spec]
  assert split and all(c.parts == 2 for c in split)


def test_model_axis_halves_parameter_bytes() -> None:
  params, specs, fn = mlp_model()
  mesh = _mesh({"pipe": 2, "model": 2})
  batch = _batch(16, False)
  graph = tj.placements.vshape(2, mode="train")
  split = tj.schedule(fn, mesh=mesh, placement=graph, num_microbatches=4,
                      plan="1f1b", data_axes=(), param_sharding=specs)
  whole = tj.schedule(fn, mesh=mesh, placement=graph, num_microbatches=4,
                      plan="1f1b", data_axes=())
  b_split = max(split.build(params, batch).layout.bytes_per_device())
  b_whole = max(whole.build(params, batch).layout.bytes_per_device())
  bias = H * 4
  assert b_split - bias == (b_whole - bias) // 2


def test_param_sharding_argument_equals_value_and_grad() -> None:
  params, specs, fn = mlp_model()
  mesh = _mesh({"pipe": 2, "model": 2})
  batch = _batch(16, False)
  step = tj.schedule(fn, mesh=mesh, placement=tj.placements.vshape(
      2, mode="train"), num_microbatches=4, plan="1f1b", data_axes=(),
                     param_sharding=specs)
  loss, grads = step(params, batch)
  ref_loss, ref_grads = reference(fn, params, batch, 4)
  assert max_rel_err((loss, grads), (ref_loss, ref_grads)) <= TOL
  assert _spec_of(grads["layers"][0]["up"]) == (None, "model")


def test_sharding_constraint_inside_fn() -> None:
  """A constraint naming the user's mesh (data and model axes) works in the
  blocks (re-targeted to the map's mesh, the manual data entry dropped)."""
  params, specs, fn = mlp_model()
  mesh = _mesh({"pipe": 2, "data": 2, "model": 2})
  inner = NamedSharding(mesh, P("data", "model"))

  def constrained(params: Any, batch: Any) -> Any:
    h = batch["x"]
    for i, lp in enumerate(params["layers"]):
      u = jax.lax.with_sharding_constraint(jax.nn.gelu(h @ lp["up"]), inner)
      h = h + u @ lp["down"] + lp["b"]
      if i < LAYERS - 1:
        h = tj.boundary(h)
    return jnp.mean((h - batch["y"]) ** 2)

  batch = _batch(16, False)
  step = tj.schedule(constrained, mesh=mesh, placement=tj.placements.vshape(
      2, mode="train"), num_microbatches=4, data_axes=("data",),
                     plan="1f1b")
  loss, grads = step(_put(params, specs, mesh), batch)
  ref = reference(fn, params, batch, 4)
  assert max_rel_err((loss, grads), ref) <= TOL


def test_constraint_dropped_in_a_one_device_kernel() -> None:
  """Measured costs compile each kernel alone for one device, where a
  constraint naming the whole mesh would be refused: it is dropped there."""
  mesh = _mesh({"pipe": 2, "model": 2})
  closed = jax.make_jaxpr(lambda x: jnp.sin(jax.lax.with_sharding_constraint(
      x * 2, NamedSharding(mesh, P(None, "model")))))(jnp.ones((2, 4)))
  x = jax.device_put(jnp.arange(8.0).reshape(2, 4), jax.devices()[0])
  got = jax.jit(lambda x: compat.eval_closed(closed, [x])[0])(x)
  np.testing.assert_allclose(got, np.sin(2 * np.arange(8.0).reshape(2, 4)),
                             rtol=1e-6)


def test_param_split_over_an_unknown_axis_is_refused() -> None:
  """(A leaf split over a data axis is FSDP: tests/test_fsdp.py.)"""
  params, _, fn = mlp_model()
  specs = {"layers": [dict(MLP_SPECS, up=P(None, "expert"))] * LAYERS}
  mesh = _mesh({"pipe": 2, "data": 2, "model": 2})
  step = tj.schedule(fn, mesh=mesh, placement="vshape", num_microbatches=4,
                     plan="1f1b", data_axes=("data",), param_sharding=specs)
  with pytest.raises(tj.TesselError, match=r"\['layers'\]\[0\]\['up'\].*"
                     r"naming 'expert', which is not an axis of the mesh"):
    step(params, _batch(16, False))


def test_bad_data_axis_is_refused() -> None:
  params, _, fn = mlp_model()
  mesh = _mesh({"pipe": 2, "model": 2})
  step = tj.schedule(fn, mesh=mesh, placement="vshape", num_microbatches=4,
                     data_axes=("batch",))
  with pytest.raises(tj.TesselError, match="'batch', which is not an axis"):
    step(params, _batch(16, False))


def test_missing_data_axes_warns_and_infers() -> None:
  params, specs, fn = mlp_model()
  mesh = _mesh({"pipe": 2, "data": 2, "model": 2})
  step = tj.schedule(fn, mesh=mesh, placement="vshape", num_microbatches=4,
                     plan="1f1b", param_sharding=specs)
  with pytest.warns(UserWarning, match=r"data_axes is not given, so mesh axes"
                    r" \('data',\) split the batch .* \('model',\)"):
    data, auto, _ = step._axes(params)  # pylint: disable=protected-access
  assert (data, auto) == (("data",), ("model",))
  with warnings.catch_warnings():
    warnings.simplefilter("error")
    quiet = tj.schedule(fn, mesh=mesh, placement="vshape",
                        num_microbatches=4, data_axes=("data",))
    assert quiet._axes(params)[:2] == (("data",), ("model",))  # pylint: disable=protected-access


def test_split_activation_crosses_stages_as_shards() -> None:
  """A boundary value split over ``model`` (the MLP's inner activation) is
  sent by ``ppermute`` shard by shard: each device sends ``(rows, F / 2)``,
  nothing is gathered."""
  params, specs, _ = mlp_model()
  params = {"layers": params["layers"][:1]}
  mesh = _mesh({"pipe": 2, "model": 2})

  def fn(params: Any, batch: Any) -> Any:
    lp = params["layers"][0]
    u = tj.boundary(jax.nn.gelu(batch["x"] @ lp["up"]))
    h = batch["x"] + u @ lp["down"] + lp["b"]
    return jnp.mean((h - batch["y"]) ** 2)

  batch = _batch(16, False)
  sharded = _put(params, {"layers": specs["layers"][:1]}, mesh)
  step = tj.schedule(fn, mesh=mesh, placement=tj.placements.vshape(2),
                     num_microbatches=4, plan="1f1b", data_axes=())
  compiled = step.lower(sharded, batch).compile()
  assert max_rel_err(compiled(sharded, batch),
                     reference(fn, params, batch, 4)) <= TOL
  sent = re.findall(r"= f32\[([\d,]+)\]\S* collective-permute(?:-start)?\(.*"
                    r"shard_map", compiled.as_text())
  assert "4,32" in sent and "4,64" not in sent, sent
  assert not _gathered_weights(compiled.as_text(), params)


def test_explicit_mesh_returns_grads_on_the_users_mesh() -> None:
  """``jax.make_mesh``'s default Explicit axes: same numbers, and the
  gradients come back on the user's mesh, so an update mixing parameters
  and gradients works."""
  params, specs, fn = mlp_model()
  mesh = _mesh({"pipe": 2, "model": 2}, AxisType.Explicit)
  sharded = _put(params, specs, mesh)
  batch = _batch(16, False)
  step = tj.schedule(fn, mesh=mesh, placement=tj.placements.vshape(2),
                     num_microbatches=4, plan="1f1b", data_axes=())
  loss, grads = step(sharded, batch)
  assert max_rel_err((loss, grads), reference(fn, params, batch, 4)) <= TOL
  up = grads["layers"][0]["up"]
  assert up.sharding.mesh == mesh and _spec_of(up) == (None, "model")
  new = jax.tree_util.tree_map(lambda p, g: p - 0.1 * g, sharded, grads)
  assert _spec_of(new["layers"][1]["down"]) == ("model",)


def test_inference_on_pipe_data_model() -> None:
  params, specs, _ = mlp_model()

  def forward(params: Any, batch: Any) -> Any:
    h = batch["x"]
    for i, lp in enumerate(params["layers"]):
      h = _mlp(lp, h)
      if i < LAYERS - 1:
        h = tj.boundary(h)
    return h

  mesh = _mesh({"pipe": 2, "data": 2, "model": 2})
  batch = _batch(16, False)
  step = tj.schedule(forward, mesh=mesh, placement=tj.placements.vshape(
      2, mode="infer"), num_microbatches=4, data_axes=("data",),
                     mode="infer", plan="gpipe")
  out = step(_put(params, specs, mesh), batch)
  assert max_rel_err(out, reference_infer(forward, params, batch, 4)) <= TOL

