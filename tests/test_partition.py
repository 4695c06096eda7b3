"""tj.boundary and the partition pass; every user-facing error path."""

from __future__ import annotations

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

import tessel_jax as tj
from tessel_jax.api import TesselError
from tessel_jax import compat

try:
  from tessel_jax.passes import partition as P  # type: ignore
  from tessel_jax.passes import tracing as T  # type: ignore
except ImportError:
  from passes import partition as P  # type: ignore
  from passes import tracing as T  # type: ignore


# --- the boundary primitive -------------------------------------------------


def _two_block(w, x):
  h = jnp.tanh(x @ w)
  h = tj.boundary(h)
  return jnp.sum(h * h)


def test_boundary_is_identity_under_jit_vmap_grad():
  w = jnp.arange(9.0).reshape(3, 3) / 10
  x = jnp.arange(6.0).reshape(2, 3) / 5
  plain = lambda w, x: jnp.sum(jnp.tanh(x @ w) ** 2)
  np.testing.assert_allclose(_two_block(w, x), plain(w, x), rtol=1e-6)
  np.testing.assert_allclose(jax.jit(_two_block)(w, x), plain(w, x), rtol=1e-6)
  np.testing.assert_allclose(jax.grad(_two_block)(w, x),
                             jax.grad(plain)(w, x), rtol=1e-6)
  np.testing.assert_allclose(
      jax.vmap(_two_block, (None, 0))(w, x[:, None]),
      jax.vmap(plain, (None, 0))(w, x[:, None]), rtol=1e-6)
  np.testing.assert_allclose(jax.jit(jax.grad(_two_block))(w, x),
                             jax.grad(plain)(w, x), rtol=1e-6)
  jaxpr = jax.make_jaxpr(_two_block)(w, x)
  assert sum(compat.is_boundary(e) for e in jaxpr.jaxpr.eqns) == 1


def test_boundary_takes_pytrees_and_several_values():
  a, b = jnp.ones(2), {"k": jnp.zeros(3)}
  out = tj.boundary(a, b)
  assert isinstance(out, tuple) and out[1]["k"].shape == (3,)
  assert tj.boundary(a) is not None
  with pytest.raises(TypeError, match="at least one array"):
    tj.boundary()


# --- partition ----------------------------------------------------------------


def _abstract(tree):
  return jax.tree_util.tree_map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype),
                                tree)


def _skip_fn(params, batch):
  h0 = batch["x"] @ params["a"]            # block 0
  h = tj.boundary(jnp.tanh(h0))
  h = h @ params["b"]                      # block 1
  h = tj.boundary(h)
  return jnp.mean((h + h0) * params["a"][0, 0])   # block 2 reads h0 directly


def test_partition_finds_inputs_outputs_and_params():
  params = {"a": jnp.ones((4, 4)), "b": jnp.ones((4, 4))}
  batch = {"x": jnp.ones((2, 4))}
  traced = T.trace(_skip_fn, "_skip_fn", _abstract(params), _abstract(batch))
  assert traced.num_blocks == 3
  part = P.partition(traced)
  b0, b1, b2 = part.blocks
  assert P.leaves_used(b0, "param") == (0,) and P.leaves_used(b0, "batch") == (0,)
  assert P.leaves_used(b1, "param") == (1,)
  assert P.leaves_used(b2, "param") == (0,)            # the tied use of "a"
  assert (0, 2) in part.edges and (0, 1) in part.edges and (1, 2) in part.edges
  assert [s.kind for s in b2.inputs].count("act") == 2
  assert part.epilogue.is_identity
  # Running the blocks in order reproduces the function.
  leaves = jax.tree_util.tree_leaves(params)
  x = batch["x"]
  outs = {}
  for blk in part.blocks:
    args = []
    for s in blk.inputs:
      args.append(leaves[s.index] if s.kind == "param" else
                  x if s.kind == "batch" else outs[(s.index, s.output)])
    for k, v in enumerate(blk(*args)):
      outs[(blk.index, k)] = v
  np.testing.assert_allclose(outs[(2, 0)], _skip_fn(params, batch), rtol=1e-6)


def test_boundary_inside_nested_jit_is_inlined():
  @jax.jit
  def inner(h):
    return tj.boundary(jnp.sin(h))

  def fn(params, batch):
    return jnp.sum(inner(batch["x"] * params["w"]) ** 2)

  traced = T.trace(fn, "fn", {"w": jax.ShapeDtypeStruct((3,), jnp.float32)},
                   {"x": jax.ShapeDtypeStruct((2, 3), jnp.float32)})
  assert traced.num_blocks == 2


@pytest.mark.parametrize("where", ["cond", "scan", "while"])
def test_boundary_inside_control_flow_is_an_error(where):
  def fn(params, batch):
    h = batch["x"] * params["w"]
    if where == "cond":
      h = lax.cond(True, lambda v: tj.boundary(v), lambda v: v, h)
    elif where == "scan":  # a top-level scan's body may hold one; deeper not
      h, _ = lax.scan(lambda c, _: (lax.scan(
          lambda d, _: (tj.boundary(d * 2), None), c, None, length=2)[0],
                                    None), h, None, length=2)
    else:
      # (a fori_loop with static bounds is a scan: cut per iteration)
      h = lax.while_loop(lambda c: c[0, 0] < 2.0,
                         lambda c: tj.boundary(c + 1.0), h)
    return jnp.sum(h)

  word = {"cond": "lax.cond", "scan": "lax.scan",
          "while": "lax.while_loop"}[where]
  with pytest.raises(TesselError, match=re.escape(word)) as err:
    T.trace(fn, "fn", {"w": jax.ShapeDtypeStruct((3,), jnp.float32)},
            {"x": jax.ShapeDtypeStruct((2, 3), jnp.float32)})
  assert "tessel_jax.schedule applied to 'fn'" in str(err.value)
  assert "top level" in str(err.value)


def test_boundary_in_top_level_scan_body_cuts_every_iteration():
  def fn(params, batch):
    h, _ = lax.scan(lambda c, w: (tj.boundary(jnp.tanh(c * w)), None),
                    batch["x"], params["w"])
    return jnp.sum(h)

  traced = T.trace(fn, "fn", {"w": jax.ShapeDtypeStruct((3, 3), jnp.float32)},
                   {"x": jax.ShapeDtypeStruct((2, 3), jnp.float32)})
  assert traced.num_blocks == 3


# --- errors through tj.schedule ---------------------------------------------


def _chain(n_blocks):
  def chain_loss(params, batch):
    h = batch["x"]
    for i in range(n_blocks):
      h = jnp.tanh(h @ params["w"][i])
      if i < n_blocks - 1:
        h = tj.boundary(h)
    return jnp.mean(h ** 2)
  return chain_loss


def _data(n_blocks, rows=8):
  params = {"w": [jnp.eye(4) * 0.5 for _ in range(n_blocks)]}
  batch = {"x": jnp.ones((rows, 4))}
  return params, batch


@pytest.fixture(scope="module")
def mesh2():
  return jax.make_mesh((2,), ("pipe",))


def test_wrong_block_count_names_both_counts_and_a_fitting_placement(mesh2):
  params, batch = _data(3)
  step = tj.schedule(_chain(3), mesh=mesh2, placement=tj.placements.vshape(2),
                     num_microbatches=2)
  with pytest.raises(TesselError) as err:
    step(params, batch)
  msg = str(err.value)
  assert "'chain_loss'" in msg
  assert "3 blocks" in msg and "2 forward blocks" in msg
  assert "remove 1 tj.boundary" in msg
  assert "placements.mshape(2)" in msg      # mshape(2) has 3 forward blocks


def test_mesh_without_pipe_axis():
  mesh = jax.make_mesh((2,), ("data",))
  with pytest.raises(TesselError, match="no 'pipe' axis"):
    tj.schedule(_chain(2), mesh=mesh, placement=tj.placements.vshape(2),
                num_microbatches=2)


def test_batch_not_divisible_by_num_microbatches(mesh2):
  params, batch = _data(2, rows=6)
  step = tj.schedule(_chain(2), mesh=mesh2, placement=tj.placements.vshape(2),
                     num_microbatches=4)
  with pytest.raises(TesselError, match="6 examples.*num_microbatches=4"):
    step(params, batch)


def test_placement_for_another_device_count(mesh2):
  params, batch = _data(4)
  step = tj.schedule(_chain(4), mesh=mesh2, placement=tj.placements.vshape(4),
                     num_microbatches=2)
  with pytest.raises(TesselError, match="for 4 devices but mesh axis 'pipe'"
                     " has 2"):
    step(params, batch)


def test_train_needs_a_scalar_loss(mesh2):
  def two_outputs(params, batch):
    h = tj.boundary(batch["x"] @ params["w"][0])
    return h @ params["w"][1]

  params, batch = _data(2)
  step = tj.schedule(two_outputs, mesh=mesh2,
                     placement=tj.placements.vshape(2), num_microbatches=2)
  with pytest.raises(TesselError, match="one scalar float loss"):
    step(params, batch)


def test_bad_mode_and_num_microbatches(mesh2):
  with pytest.raises(TesselError, match="mode is 'eval'"):
    tj.schedule(_chain(2), mesh=mesh2, placement="vshape",
                num_microbatches=2, mode="eval")
  with pytest.raises(TesselError, match="num_microbatches must be"):
    tj.schedule(_chain(2), mesh=mesh2, placement="vshape",
                num_microbatches=0)


def test_schedule_before_any_call_says_what_to_do(mesh2):
  step = tj.schedule(_chain(2), mesh=mesh2, placement="vshape",
                     num_microbatches=2)
  with pytest.raises(TesselError, match="call the step"):
    _ = step.schedule


def test_hand_placement_device_out_of_range(mesh2):
  params, batch = _data(2)
  step = tj.schedule(_chain(2), mesh=mesh2, placement=tj.Placement([0, 2]),
                     num_microbatches=2)
  with pytest.raises(TesselError, match="device 2"):
    step(params, batch)


def test_data_flow_against_the_placement_edges(mesh2):
  # Block 2 reads block 0 directly: fine in a chain (0 -> 1 -> 2).
  # In an X-shape the towers are independent: a block of tower B reading
  # tower A's activation has no ordering edge.
  def crossing(params, batch):
    a = tj.boundary(batch["x"] @ params["w"][0])     # F0 (tower A, dev 0)
    a2 = tj.boundary(a @ params["w"][1])             # F1 (tower A, dev 1)
    b = tj.boundary(batch["x"] @ params["w"][2] + a)  # F2 (tower B) reads F0
    return jnp.mean((b @ params["w"][3]) ** 2) + jnp.mean(a2)

  params, batch = _data(4)
  step = tj.schedule(crossing, mesh=mesh2, placement=tj.placements.xshape(2),
                     num_microbatches=2)
  with pytest.raises(TesselError, match="no path of edges F0 -> F2"):
    step(params, batch)


def test_nonaffine_combination_of_independent_towers(mesh2):
  def towers(params, batch):
    a = tj.boundary(batch["x"] @ params["w"][0])
    la = tj.boundary(jnp.mean(a @ params["w"][1]))
    b = tj.boundary(batch["x"] @ params["w"][2])
    lb = jnp.mean(b @ params["w"][3])
    return la * lb                                   # not affine

  params, batch = _data(4)
  step = tj.schedule(towers, mesh=mesh2, placement=tj.placements.xshape(2),
                     num_microbatches=2)
  with pytest.raises(TesselError, match="not affine"):
    step(params, batch)


def test_shared_block_with_indivisible_rows_runs_replicated():
  mesh = jax.make_mesh((2,), ("pipe",))
  params, batch = _data(3, rows=6)
  params["w"] = [w + 0.1 * i for i, w in enumerate(params["w"])]
  batch["x"] = batch["x"] * jnp.arange(6.0)[:, None]
  step = tj.schedule(_chain(3), mesh=mesh, placement=tj.placements.mshape(2),
                     num_microbatches=2)            # 3 rows per micro-batch
  loss, grads = step(params, batch)

  def ref(p):
    return jnp.mean(jnp.stack([_chain(3)(p, {"x": batch["x"][3 * m:3 * m + 3]})
                               for m in range(2)]))
  want_loss, want_grads = jax.value_and_grad(ref)(params)
  np.testing.assert_allclose(loss, want_loss, rtol=1e-5)
  for g, w in zip(grads["w"], want_grads["w"]):
    np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-7)
  assert "replicated: 3 rows do not divide over 2 devices" in step.grid()
