"""A layer stack written as one ``lax.scan`` is cut like unrolled layers.

``passes.scan_split`` turns a top-level scan into sub-scans over slices of
the stacked leaves at the iteration boundaries the automatic cut picks.
Checked here: the cut program computes ``fn`` (forward and gradients,
reverse scans, stacked ys, remat'd bodies, checkpointed scans, scans inside
``jax.jit``); whole programs scheduled on vshape(4) / mshape(4), train and
infer, equal ``jax.value_and_grad`` with the gradient in the stacked leaf;
the cut balances whole layers; a ``tj.boundary`` inside the scanned body
cuts after every layer; penzai's scanned llama-like model (if installed).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import tessel_jax as tj
from tessel_jax import compat
from tessel_jax.api import TesselError
from tessel_jax.passes import autocut, cut_dp, scan_split
from tessel_jax.passes import partition as _partition
from tessel_jax.passes import tracing as _tracing

TOL = 1e-5
LAYERS = 8
D = 8


def _params(layers: int = LAYERS, seed: int = 0) -> dict:
  k = jax.random.split(jax.random.key(seed), 4)
  return {"w": jax.random.normal(k[0], (layers, D, D)) * 0.4,
          "b": jax.random.normal(k[1], (layers, D)) * 0.1,
          "emb": jax.random.normal(k[2], (D, D)) * 0.5,
          "out": jax.random.normal(k[3], (D,)) * 0.5}


def _batch(rows: int, seed: int = 1) -> dict:
  rng = np.random.default_rng(seed)
  return {"x": jnp.asarray(rng.normal(size=(rows, D)), jnp.float32),
          "y": jnp.asarray(rng.normal(size=(rows,)), jnp.float32)}


def _layer(h, wb):
  w, b = wb
  return jnp.tanh(h @ w + b) + h


def scanned(variant: str = "plain"):
  """An embedding, a scanned stack of layers over ``p["w"], p["b"]`` and a
  head; ``variant`` picks how the stack is written."""

  def stack(p, h):
    if variant == "remat_body":
      body = jax.checkpoint(lambda c, wb: (_layer(c, wb), None))
      return jax.lax.scan(body, h, (p["w"], p["b"]))[0], 0.0
    if variant == "remat_scan":
      return jax.checkpoint(lambda w, b, h: jax.lax.scan(
          lambda c, wb: (_layer(c, wb), None), h, (w, b))[0])(
              p["w"], p["b"], h), 0.0
    if variant == "jit":
      return jax.jit(lambda w, b, h: jax.lax.scan(
          lambda c, wb: (_layer(c, wb), None), h, (w, b))[0])(
              p["w"], p["b"], h), 0.0
    if variant == "ys":  # stacked per-layer residuals read by the loss
      h, ys = jax.lax.scan(lambda c, wb: (_layer(c, wb), c.mean(-1)), h,
                           (p["w"], p["b"]))
      return h, 0.1 * jnp.mean(ys ** 2)
    if variant == "consts":  # the body reads an activation made outside
      gate = jax.nn.sigmoid(h.mean(0))
      return jax.lax.scan(lambda c, wb: (_layer(c, wb) * gate, None), h,
                          (p["w"], p["b"]))[0], 0.0
    if variant == "two":  # two stacks (encoder, decoder) one after another
      half = LAYERS // 2
      body = lambda c, wb: (_layer(c, wb), None)
      h = jax.lax.scan(body, h, (p["w"][:half], p["b"][:half]))[0]
      return jax.lax.scan(body, jnp.sin(h),
                          (p["w"][half:], p["b"][half:]))[0], 0.0
    if variant == "reverse":
      return jax.lax.scan(lambda c, wb: (_layer(c, wb), None), h,
                          (p["w"], p["b"]), reverse=True)[0], 0.0
    if variant == "marked":  # a hand cut: a boundary after every layer
      return jax.lax.scan(lambda c, wb: (tj.boundary(_layer(c, wb)), None),
                          h, (p["w"], p["b"]))[0], 0.0
    assert variant == "plain"
    return jax.lax.scan(lambda c, wb: (_layer(c, wb), None), h,
                        (p["w"], p["b"]))[0], 0.0

  def loss_fn(p, batch):
    h = jnp.tanh(batch["x"] @ p["emb"])
    h, extra = stack(p, h)
    return jnp.mean((h @ p["out"] - batch["y"]) ** 2) + extra

  loss_fn.__name__ = f"scanned_{variant}"
  return loss_fn


def _leaves(params, batch):
  return jax.tree_util.tree_leaves(params) + jax.tree_util.tree_leaves(batch)


def _cut(fn, params, batch, blocks, **kw):
  traced = _tracing.trace(fn, fn.__name__, params, batch)
  return autocut.cut_to(traced, blocks, cut="auto", cost="analytic", **kw)


def _scans(closed):
  return [e for e in closed.jaxpr.eqns if compat.is_scan(e)
          or compat.remat_info(e) is not None]


def _max_rel(a, b):
  return max(float(jnp.max(jnp.abs(x - y)) / (jnp.max(jnp.abs(y)) + 1e-30))
             for x, y in zip(jax.tree_util.tree_leaves(a),
                             jax.tree_util.tree_leaves(b)))


# --- the rewritten program computes fn ----------------------------------------


@pytest.mark.parametrize("variant", ["plain", "remat_body", "remat_scan",
                                     "jit", "ys", "reverse", "consts",
                                     "two"])
def test_cut_program_equals_fn_with_grads(variant):
  fn = scanned(variant)
  params, batch = _params(), _batch(4)
  cut = _cut(fn, params, batch, 4)
  assert cut.num_blocks == 4
  info = autocut.cut_info(cut)
  assert len(info.structure) >= LAYERS   # one unit per iteration
  # Sub-scans, one per block ("two": 2 + 2, cut between the stacks too).
  assert len(_scans(cut.closed_jaxpr)) == 4
  n_p = len(jax.tree_util.tree_leaves(params))

  split = autocut._split_leaves(cut)   # stacked leaves stored as slices
  assert (split.leaf_split is not None) == (variant != "two")

  def run(p, traced):
    leaves = jax.tree_util.tree_leaves(p)
    if traced.leaf_split is not None:
      leaves = traced.leaf_split.split(leaves)
    return compat.eval_closed(traced.closed_jaxpr, list(leaves) +
                              jax.tree_util.tree_leaves(batch))[0]

  ref, ref_g = jax.jit(jax.value_and_grad(fn))(params, batch)
  for traced in (cut, split):
    got, got_g = jax.jit(jax.value_and_grad(run), static_argnums=1)(
        params, traced)
    assert abs(float(got) - float(ref)) <= TOL * abs(float(ref))
    assert jax.tree_util.tree_structure(got_g) == (
        jax.tree_util.tree_structure(ref_g))
    assert got_g["w"].shape == (LAYERS, D, D)      # one stacked leaf
    assert _max_rel(got_g, ref_g) <= TOL
  assert n_p == 4
  if split.leaf_split is not None:
    assert len(split.param_avals) == n_p - 2 + 2 * 4   # w, b in 4 slices
    merged = split.leaf_split.merge(split.leaf_split.split(
        jax.tree_util.tree_leaves(params)))
    for a, b in zip(merged, jax.tree_util.tree_leaves(params)):
      np.testing.assert_array_equal(a, b)


def test_sub_scans_slice_the_stacked_leaf_in_order():
  fn = scanned("reverse")
  cut = _cut(fn, _params(), _batch(4), 4)
  lengths = [compat.scan_layout(e)[0] for e in _scans(cut.closed_jaxpr)]
  assert sum(lengths) == LAYERS and min(lengths) >= 1


# --- balance ------------------------------------------------------------------


def test_whole_layers_balanced_on_vshape_and_mshape():
  # vshape(4): 4 forward blocks; mshape(4): block 0 on 4 devices (weight
  # 1/4, the api's weighting of a shared block) and 4 more.
  fn = scanned()
  params, batch = _params(), _batch(4)
  for blocks, weights in ((4, None), (5, [0.25, 1, 1, 1, 1])):
    cut = _cut(fn, params, batch, blocks, weights=weights)
    info = autocut.cut_info(cut)
    costs = np.asarray(info.block_costs)
    assert costs.max() <= 1.2 * costs.mean(), info.describe()
    # No block near-empty while another holds several layers.
    assert costs.min() >= 0.5 * max(info.eqn_costs), info.describe()
    assert costs.max() <= info.best_max_cost * (1 + info.tolerance) + 1e-12


def test_too_few_units_names_the_fix():
  fn = scanned()
  traced = _tracing.trace(fn, "f", _params(2), _batch(4))
  with pytest.raises(TesselError, match="a scan one per iteration"):
    autocut.cut_to(traced, 40, cost="analytic")


# --- markers inside the scanned body ------------------------------------------


def test_boundary_in_scanned_body_cuts_after_every_layer():
  fn = scanned("marked")
  params, batch = _params(4), _batch(4)
  traced = _tracing.trace(fn, "f", params, batch)
  assert traced.num_blocks == 4
  assert not scan_split.marked_scans(traced.closed_jaxpr)
  part = _partition.partition(traced)
  assert len(part.blocks) == 4
  got = compat.eval_closed(traced.closed_jaxpr, _leaves(params, batch))[0]
  assert abs(float(got) - float(fn(params, batch))) <= TOL * abs(float(got))


def test_boundary_inside_cond_still_refused():
  def fn(p, batch):
    return jax.lax.cond(True, lambda h: tj.boundary(h * 2), lambda h: h,
                        batch["x"]).sum() * p

  with pytest.raises(TesselError, match="lax.cond"):
    _tracing.trace(fn, "f", jnp.ones(()), _batch(4))


# --- whole programs through tj.schedule ---------------------------------------


def _reference(fn, params, batch, n):
  def mean_loss(p):
    mbs = jax.tree_util.tree_map(
        lambda x: x.reshape((n, -1) + x.shape[1:]), batch)
    return jnp.mean(jax.vmap(lambda b: fn(p, b))(mbs))

  return jax.value_and_grad(mean_loss)(params)


@pytest.mark.parametrize("placement,variant", [
    ("vshape", "plain"), ("mshape", "ys"), ("vshape", "remat_body")])
def test_schedule_train_equals_value_and_grad(placement, variant):
  n = 4
  fn = scanned(variant)
  params, batch = _params(), _batch(4 * n)
  mesh = tj.cpu_mesh(4)
  step = tj.schedule(fn, mesh=mesh, placement=getattr(tj.placements,
                                                      placement)(4),
                     num_microbatches=n, cut="auto")
  loss, grads = step(params, batch)
  ref_loss, ref_grads = _reference(fn, params, batch, n)
  assert abs(float(loss) - float(ref_loss)) <= TOL * abs(float(ref_loss))
  assert grads["w"].shape == (LAYERS, D, D)
  assert _max_rel(grads, ref_grads) <= TOL
  # Each device stores only its blocks' layers (2 of 8 on vshape; mshape's
  # block 0 is on every device), not the whole stack: the stacked leaves are
  # stored as per-block slices.
  stack = (params["w"].size + params["b"].size) * 4
  held = max(step.built.layout.bytes_per_device())
  assert held < (stack / 2 if placement == "vshape" else stack)


def test_schedule_infer_and_marked_stack():
  n = 4
  mesh = tj.cpu_mesh(4)
  params, batch = _params(), _batch(4 * n)
  fn = scanned("jit")
  step = tj.schedule(fn, mesh=mesh, placement=tj.placements.mshape(4),
                     num_microbatches=n, cut="auto", mode="infer")
  mbs = jax.tree_util.tree_map(lambda x: x.reshape((n, -1) + x.shape[1:]),
                               batch)
  ref = jax.vmap(lambda b: fn(params, b))(mbs)
  assert _max_rel(step(params, batch), ref) <= TOL
  marked = scanned("marked")
  p4 = _params(4)
  step = tj.schedule(marked, mesh=mesh, placement=tj.placements.vshape(4),
                     num_microbatches=n)
  loss, grads = step(p4, batch)
  ref_loss, ref_grads = _reference(scanned("plain"), p4, batch, n)
  assert abs(float(loss) - float(ref_loss)) <= TOL * abs(float(ref_loss))
  assert _max_rel(grads, ref_grads) <= TOL


# --- penzai's scanned llama-like model ----------------------------------------


def test_penzai_layer_stack_auto_cut():
  pytest.importorskip("penzai")
  from experiments import model_zoo_models  # pylint: disable=import-outside-toplevel
  model = model_zoo_models.penzai_llama(4)
  traced = _tracing.trace(model.fn, "penzai", model.params, model.batch)
  cut = autocut.cut_to(traced, 4, cut="auto", cost="analytic")
  info = autocut.cut_info(cut)
  costs = np.asarray(info.block_costs)
  assert costs.max() <= 1.2 * costs.mean(), info.describe()
  leaves = _leaves(model.params, model.batch)
  n_p = len(jax.tree_util.tree_leaves(model.params))

  def run(p_leaves):
    return compat.eval_closed(cut.closed_jaxpr,
                              list(p_leaves) + leaves[n_p:])[0]

  got, got_g = jax.jit(jax.value_and_grad(run))(leaves[:n_p])
  ref, ref_g = jax.jit(jax.value_and_grad(
      lambda pl: compat.eval_closed(traced.closed_jaxpr,
                                    list(pl) + leaves[n_p:])[0]))(leaves[:n_p])
  assert abs(float(got) - float(ref)) <= TOL * abs(float(ref))
  assert _max_rel(got_g, ref_g) <= TOL


def test_floor_is_the_brute_force_max_min():
  rng = np.random.default_rng(0)
  for _ in range(20):
    n, k = int(rng.integers(3, 9)), int(rng.integers(2, 4))
    costs = rng.uniform(0, 1, n)
    best = cut_dp.min_max_cost(costs, k)
    bound = best * 1.1
    brute = -np.inf
    for pos in __import__("itertools").combinations(range(1, n), k - 1):
      c = cut_dp.block_costs(costs, pos)
      if c.max() <= bound:
        brute = max(brute, c.min())
    assert np.isclose(cut_dp.max_min_cost(costs, k, bound), brute)
    pos, _ = cut_dp.optimal_cuts(costs, np.zeros(n + 1), k, tolerance=0.1,
                                  floor=True)
    c = cut_dp.block_costs(costs, pos)
    assert c.max() <= bound + 1e-9 and c.min() >= 0.9 * brute - 1e-9


def test_floor_keeps_a_shared_block_from_taking_the_stack():
  # penzai's 4 scanned layers on mshape(4): block 0 on 4 devices (weight
  # 1/4) can hold every layer at the same busiest cost, and the cut after
  # the head is cheap in bytes; without the floor the last blocks are
  # near-empty; with it every block holds a layer or the head.
  costs = [0.01, 1, 1, 1, 1, 0.04, 0.001, 0.001, 0.001]
  live = [0, 100, 100, 100, 100, 100, 4, 4, 4, 0]
  w = [0.25, 1, 1, 1, 1]
  loose, _ = cut_dp.optimal_cuts(costs, live, 5, weights=w)
  assert cut_dp.block_costs(costs, loose, w).min() < 0.01
  pos, _ = cut_dp.optimal_cuts(costs, live, 5, weights=w, floor=True)
  assert pos == (2, 3, 4, 5)


def test_hand_cut_groups_of_layers_by_slicing_the_stack():
  # README recipe: layers [0, 3) | [3, 5) | [5, 8) as sub-scans over slices
  # of the stacked leaves with a tj.boundary between the groups.
  def grouped(p, batch):
    h = jnp.tanh(batch["x"] @ p["emb"])
    for a, b in ((0, 3), (3, 5), (5, 8)):
      h, _ = jax.lax.scan(lambda c, wb: (_layer(c, wb), None), h,
                          (p["w"][a:b], p["b"][a:b]))
      h = tj.boundary(h) if b < LAYERS else h
    return jnp.mean((h @ p["out"] - batch["y"]) ** 2)

  params, batch = _params(), _batch(4)
  traced = _tracing.trace(grouped, "grouped", params, batch)
  part = _partition.partition(traced)
  assert len(part.blocks) == 3
  w_leaf = sorted(params).index("w")   # dict leaves in key order
  for block in part.blocks:   # every block reads the stacked leaf itself
    assert any(s.kind == "param" and s.index == w_leaf for s in block.inputs)

  def run(p):
    return compat.eval_closed(traced.closed_jaxpr, _leaves(p, batch))[0]

  got, got_g = jax.jit(jax.value_and_grad(run))(params)
  ref, ref_g = jax.jit(jax.value_and_grad(scanned()))(params, batch)
  assert abs(float(got) - float(ref)) <= TOL * abs(float(ref))
  assert _max_rel(got_g, ref_g) <= TOL


def test_with_cut_marks_a_scanned_function():
  fn = scanned("ys")
  params = _params()
  marked = autocut.with_cut(fn, params, _batch(4), 4, cost="analytic")
  batch = _batch(8, seed=3)   # re-traced at another batch size
  got, got_g = jax.jit(jax.value_and_grad(marked))(params, batch)
  ref, ref_g = jax.jit(jax.value_and_grad(fn))(params, batch)
  assert abs(float(got) - float(ref)) <= TOL * abs(float(ref))
  assert _max_rel(got_g, ref_g) <= TOL
  traced = _tracing.trace(marked, "m", params, batch)
  assert traced.num_blocks == 4


def test_scan_over_the_batch_rows_stays_whole():
  # A loop over rows / time steps (xs from the micro-batch) is not a layer
  # stack: its length follows the batch, so it is not split.
  def rnn(p, batch):
    h, ys = jax.lax.scan(lambda c, x: (jnp.tanh(c @ p["emb"] + x), c),
                         jnp.zeros(D), batch["x"])
    return jnp.mean(ys) + jnp.sum(h)

  params = _params()
  traced = _tracing.trace(rnn, "rnn", params, _batch(6))
  flat = autocut.flatten(traced)
  assert scan_split.sites(flat)              # a scan that could be split
  assert not scan_split.sites(flat, len(traced.param_avals))
  stacked = _tracing.trace(scanned(), "f", params, _batch(6))
  assert scan_split.sites(autocut.flatten(stacked),
                          len(stacked.param_avals))
