"""A split backward's W reads what B computes for both (passes.w_split).

``Switches.shared_w``: B hands W the cotangent at the weight's dot (after
the elementwise derivative) instead of W redoing it from the output
cotangent and the residuals; lowered programs still equal
``jax.value_and_grad``.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import tessel_jax as tj
import tessel_jax.passes.switches as sw
from tessel_jax.passes import w_split

import test_lowering_models as M

TOL = 1e-5


def _backward(w, b, r, t, y):
  """A hand-made backward: ``s`` (elementwise in ``y`` and the residual
  ``t``) and a broadcast of the parameter ``b`` are needed by both halves;
  the weight's gradient also reads the residual ``r``."""
  s = y * (1.0 - t * t)
  bb = jnp.broadcast_to(b, y.shape)
  act = s @ w.T + bb
  grad_w = r.T @ (s * bb)
  return act, grad_w


def _split() -> tuple[w_split.Split, list]:
  rng = np.random.default_rng(0)
  args = [jnp.asarray(rng.standard_normal(s), jnp.float32)
          for s in ((6, 6), (6,), (5, 6), (5, 6), (5, 6))]
  closed = jax.make_jaxpr(lambda *a: list(_backward(*a)))(*args)
  return w_split.find(closed, num_params=2, num_res=2, num_acts=1), args


def test_find_hands_over_the_shared_value_and_recomputes_broadcasts():
  split, (w, b, r, t, y) = _split()
  # W reads the elementwise product from B (one [5, 6] value) and the
  # residual r, not t and y; the parameter's broadcast is recomputed
  # (parameters are free).
  assert [tuple(a.shape) for a in split.handoff_avals] == [(5, 6)]
  assert split.w_res == (0,)
  assert "broadcast_in_dim" in {e.primitive.name for e in split.w_eqns}
  assert not {"sub", "integer_pow"} & {e.primitive.name
                                       for e in split.w_eqns}
  assert (split.w_bytes, split.old_bytes) == (2 * 120, 3 * 120)
  acts, handoff = split.run_b([w, b], [r, t], [y])
  grads = split.run_w([w, b], [r], handoff)
  want_act, want_grad = _backward(w, b, r, t, y)
  np.testing.assert_allclose(acts[0], want_act, rtol=1e-6)
  np.testing.assert_allclose(grads[0], want_grad, rtol=1e-6)


def test_find_keeps_the_old_split_where_sharing_reads_more_bytes():
  # W's gradient reads a dot's output 4x wider than the dot's input: handing
  # it over would grow the stash, so W recomputes it from the cotangent.
  def backward(w1, w2, r, y):
    h = y @ w2
    return [h @ w1.T, r.T @ h]
  rng = np.random.default_rng(1)
  args = [jnp.asarray(rng.standard_normal(s), jnp.float32)
          for s in ((6, 24), (6, 24), (5, 6), (5, 6))]
  split = w_split.find(jax.make_jaxpr(backward)(*args), num_params=2,
                       num_res=1, num_acts=1)
  assert [tuple(a.shape) for a in split.handoff_avals] == [(5, 6)]
  assert split.w_bytes == split.old_bytes == 2 * 120
  assert [e.primitive.name for e in split.w_eqns].count("dot_general") == 2


def _model(graph):
  n_fwd = sum(1 for blk in graph.blocks if blk.kind == "F")
  kinds = ["embed"] + ["layer"] * (n_fwd - 2) + ["head"]
  return M.chain_fn(kinds), M.make_params(M.num_layers(kinds))


def _step(shared: bool, graph: tj.BlockGraph, plan: str | None):
  fn, params = _model(graph)
  mesh = jax.make_mesh((graph.num_devices,), ("pipe",))
  switches = dataclasses.replace(sw.Switches(coarse_grid=False),
                                 shared_w=shared)
  step = tj.schedule(fn, mesh=mesh, placement=graph, num_microbatches=4,
                     plan=plan, switches=switches)
  return step, fn, params, M.make_batch(4 * 4)


def _layer_w(shared: bool):
  """``(primitive names, flops, inputs)`` of zbv(2)'s first layer's W
  (built, not lowered)."""
  step, _, params, batch = _step(shared, tj.placements.zbv(2), "zbv")
  ks = step.build(params, batch).kernels.kernels
  k = next(k for k in ks.values() if k.kind == "W" and k.fwd == 1)
  pflat = jax.tree_util.tree_leaves(params)
  pv = [pflat[l] for l in k.params]
  iv = [jnp.ones(a.shape, a.dtype) for a in k.in_avals]
  f = lambda pv, iv: k.fn({"row_offset": 0}, pv, iv)
  prims = {e.primitive.name for e in jax.make_jaxpr(f)(pv, iv).jaxpr.eqns}
  cost = jax.jit(f).lower(pv, iv).compile().cost_analysis()
  cost = cost[0] if isinstance(cost, (list, tuple)) else cost
  return prims, float(cost["flops"]), len(k.inputs)


def test_w_no_longer_redoes_bs_elementwise_work():
  old, new = _layer_w(False), _layer_w(True)
  # The layer is tanh(h @ w + b) + h: its derivative (jax 0.10:
  # (1 - t) * (1 + t); jax >= 0.11 keeps 1 - t * t from the forward) is
  # B's; W keeps the weight's dot and the bias's sum over the hand-over.
  elementwise = {"sub", "mul", "add_any"}
  assert old[0] & elementwise and not new[0] & elementwise
  assert "dot_general" in new[0]
  assert new[1] < old[1]
  assert new[2] < old[2]  # one residual and the hand-over, not three + ybar


@pytest.mark.parametrize("graph,plan", [
    (tj.placements.vshape(2, split_backward=True), "zb_h1"),
    (tj.placements.zbv(2), None),
], ids=["zb_h1", "zbv_searched"])
def test_lowered_split_backward_matches_value_and_grad(graph, plan):
  step, fn, params, batch = _step(True, graph, plan)
  loss, grads = step(params, batch)
  ref_loss, ref_grads = M.reference(fn, params, batch, 4)
  assert M.max_rel_err(loss, ref_loss) <= TOL
  assert M.max_rel_err(grads, ref_grads) <= TOL
  kernels = step.built.kernels.kernels.values()
  assert any(k.kind == "W" for k in kernels)
  assert any(key[0] == "h" for k in kernels for key in k.outputs)


def test_off_by_default():
  assert not sw.Switches().shared_w
  assert sw.from_env({sw.SHARED_W_ENV: "1"}).shared_w
  assert not sw.from_env({}).shared_w
