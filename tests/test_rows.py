"""Row coupling (passes.rows) and shared blocks that are exact (passes.modes).

The analysis is checked against brute force on random programs: perturb one
row of the batch input and see which output rows move. Then models whose
shared block couples rows (batch statistics, dropout), whose micro-batch
does not divide over the sharing devices, or whose per-example code is
vmapped, run on mshape(4) and must equal ``jax.value_and_grad`` (train) and
the plain function (infer); dropout masks bit for bit.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import tessel_jax as tj
from passes import rows

import test_lowering_models as M

TOL = 1e-5
B, H = 4, 6


# --- the analysis against brute force -------------------------------------


def _const(shape, seed):
  return jnp.asarray(np.random.default_rng(seed).standard_normal(shape) * 0.5,
                     jnp.float32)


def _right_matmul(x):
  return x @ _const((x.shape[1], x.shape[1]), 1)


def _left_matmul(x):
  return _const((x.shape[0], x.shape[0]), 2) @ x


def _row_map(x):
  return jax.vmap(lambda r: jnp.tanh(r @ _const((r.shape[0],) * 2, 3)))(x)


def _reshape_round_trip(x):
  return jnp.tanh(x.reshape(x.shape[0], -1, 1) * 2.0).reshape(x.shape)


def _concat_slice(x):
  return jnp.concatenate([x, jnp.sin(x)], axis=1)[:, x.shape[1] // 2:][
      :, :x.shape[1]] if x.shape[1] % 2 == 0 else x


OPS = {
    "tanh": jnp.tanh,
    "affine": lambda x: x * 2.0 + 1.0,
    "transpose": lambda x: x.T,
    "sum1": lambda x: x + x.sum(1, keepdims=True),
    "sum0": lambda x: x + x.sum(0, keepdims=True),
    "max1": lambda x: x - x.max(1, keepdims=True),
    "cumsum0": lambda x: jnp.cumsum(x, 0),
    "cumsum1": lambda x: jnp.cumsum(x, 1),
    "sort0": lambda x: jnp.sort(x, 0),
    "sort1": lambda x: jnp.sort(x, 1),
    "flip0": lambda x: jnp.flip(x, 0),
    "flip1": lambda x: jnp.flip(x, 1),
    "roll0": lambda x: jnp.roll(x, 1, 0),
    "roll1": lambda x: jnp.roll(x, 1, 1),
    "right_matmul": _right_matmul,
    "left_matmul": _left_matmul,
    "row_map": _row_map,
    "reshape": _reshape_round_trip,
    "concat_slice": _concat_slice,
    "shift_rows": lambda x: jnp.pad(x[1:], ((0, 1), (0, 0))),
    "leaky": lambda x: jnp.where(x > 0, x, 0.1 * x),
    "col_slice": lambda x: jnp.pad(x[:, 1:], ((0, 0), (1, 0))),
    "softmax1": lambda x: jax.nn.softmax(x, axis=1),
    "take_rows": lambda x: x[np.arange(x.shape[0])[::-1]],
    "take_cols": lambda x: x[:, np.arange(x.shape[1])[::-1]],
    "scan_cols": lambda x: jax.lax.scan(
        lambda c, col: (c * 0.5 + col, c), jnp.zeros(x.shape[0]), x.T)[1].T,
    "scan_rows": lambda x: jax.lax.scan(
        lambda c, row: (c * 0.5 + row, c), jnp.zeros(x.shape[1]), x)[1],
    "cond": lambda x: jax.lax.cond(x.shape[0] > 1, jnp.sin, jnp.cos, x),
    "fori_cols": lambda x: jax.lax.fori_loop(
        0, 2, lambda i, y: jnp.roll(y, 1, 1) * 0.9 + x, x),
    "dyn_slice_cols": lambda x: jax.lax.dynamic_update_slice(
        x, jax.lax.dynamic_slice(x, (0, 1), (x.shape[0], 1)) * 3.0, (0, 0)),
    "top_k1": lambda x: x + jax.lax.top_k(x, 1)[0],
    "remat": lambda x: jax.checkpoint(lambda y: jnp.tanh(y) * y)(x),
    "custom_relu": jax.nn.relu,
    "logsumexp0": lambda x: x - jax.nn.logsumexp(x, axis=0, keepdims=True),
    "outer_rows": lambda x: (x[:, None, :] * x[None, :, :]).sum(1),
}


def _program(names):
  def f(x, w):
    outs = []
    h = x * w
    for n in names:
      h = OPS[n](h)
      outs.append(h)
    return [h] + outs[:1]
  return f


def _moved(a, b):
  return np.abs(np.asarray(a, np.float64) - np.asarray(b, np.float64)) > 0


@settings(max_examples=120, deadline=None,
          suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.sampled_from(sorted(OPS)), min_size=1, max_size=5))
def test_analysis_agrees_with_brute_force(names):
  f = _program(names)
  x = _const((B, H), 7) + 1.0
  w = jnp.float32(1.3)
  closed = jax.make_jaxpr(f)(x, w)
  found = rows.analyze(closed, [0, None], B)
  base = f(x, w)
  for r in range(B):
    bumped = f(x.at[r].add(0.37), w)
    for k, (a, b, axis) in enumerate(zip(base, bumped, found.out_axes)):
      moved = _moved(a, b)
      if axis is None:
        assert not moved.any(), (names, k, "independent output moved")
      elif axis not in (rows.MIXED, rows.SUMMED):
        others = np.delete(moved, r, axis=axis)
        assert not others.any(), (names, k, r, axis, "other rows moved")
  if not found.coupled:
    assert rows.MIXED not in found.out_axes


def _coupled(f, *args, in_axes=(0, None)):
  found = rows.analyze(jax.make_jaxpr(f)(*args), list(in_axes), B)
  return found


@pytest.mark.parametrize("f,word", [
    (lambda x, w: x - x.mean(0), "reduce_sum"),
    (lambda x, w: jnp.cumsum(x, 0) * w, "cumsum"),
    (lambda x, w: jnp.sort(x, 0), "sort"),
    (lambda x, w: jnp.argsort(x, 0), "over the batch axis"),
    (lambda x, w: jnp.where(jax.random.bernoulli(jax.random.PRNGKey(0), 0.5,
                                                 x.shape), x, 0.0), "random"),
    (lambda x, w: x + jnp.arange(B)[:, None], "iota"),
    (lambda x, w: x[jnp.array([1, 0, 3, 2])], "gather"),
    (lambda x, w: jax.lax.scan(lambda c, r: (c + r, c), jnp.zeros(H), x)[1],
     "scan over the batch axis"),
])
def test_named_couplings_are_detected(f, word):
  found = _coupled(f, _const((B, H), 1), jnp.float32(2.0))
  assert found.coupled and word in found.reason, found


def test_dropout_with_a_key_in_the_batch():
  keys = jax.random.key_data(jax.random.split(jax.random.PRNGKey(3), B))
  x = _const((B, H), 1)

  def per_row(k, r):
    keep = jax.random.bernoulli(jax.random.wrap_key_data(k), 0.5, r.shape)
    return jnp.where(keep, r, 0.0)
  found = _coupled(jax.vmap(per_row), keys, x, in_axes=(0, 0))
  assert not found.coupled and found.out_axes == (0,)
  one_key = _coupled(lambda k, r: per_row(k[0], r[0]), keys, x,
                     in_axes=(0, 0))
  assert one_key.coupled


def test_row_independent_programs_keep_their_axis():
  x, w = _const((B, H), 1), _const((H, 3), 2)
  assert _coupled(lambda x, w: jnp.tanh(x @ w), x, w).out_axes == (0,)
  vm = _coupled(lambda x, w: jax.vmap(lambda r: w.T @ r, out_axes=1)(x), x, w)
  assert not vm.coupled and vm.out_axes == (1,)
  # A causal mask or positions along another axis of the batch's size
  # (sequence length == micro-batch rows) do not couple rows.
  xs = _const((B, B, H), 3)

  def causal(x, w):
    q = jnp.einsum("bsh,bth->bst", x, x)
    return jnp.where(jnp.tril(jnp.ones((B, B), bool)), q, -1e9) + w[0, 0]
  assert _coupled(causal, xs, w).out_axes == (0,)
  pos = _coupled(lambda x, w: x + jnp.arange(B)[None, :, None], xs, w)
  assert not pos.coupled and pos.out_axes == (0,)
  am = _coupled(lambda x, w: jnp.argsort(x, 1), x, w)
  assert not am.coupled and am.out_axes == (0,)
  ck = _coupled(lambda x, w: jax.checkpoint(lambda y: jax.nn.relu(y @ w))(x),
                x, w)
  assert not ck.coupled and ck.out_axes == (0,)


# --- shared blocks on mshape(4): exact numbers ----------------------------


def _params(seed=0, hidden=8):
  ks = jax.random.split(jax.random.PRNGKey(seed), 5)
  return {"w": [jax.random.normal(k, (hidden, hidden)) * 0.4 for k in ks]}


def _batch(rows_, seed=1, hidden=8):
  rng = np.random.default_rng(seed)
  return {"x": jnp.asarray(rng.standard_normal((rows_, hidden)), jnp.float32),
          "y": jnp.asarray(rng.standard_normal((rows_, hidden)), jnp.float32)}


def _chain(shared, train=True):
  """Block 0 (all devices on mshape) runs ``shared``; 4 more blocks follow.
  ``shared(p, h, batch) -> (h, extra)``; infer returns ``(out, extra)``."""
  def fn(p, batch):
    h, extra = shared(p, jnp.tanh(batch["x"] @ p["w"][0]), batch)
    h = tj.boundary(h)
    for i in range(1, 4):
      h = tj.boundary(jnp.tanh(h @ p["w"][i]) + h)
    out = h @ p["w"][4]
    if train:
      return jnp.mean((out - batch["y"]) ** 2)
    return out, extra
  return fn


def _run(fn, params, batch, n, mode):
  mesh = jax.make_mesh((4,), ("pipe",))
  step = tj.schedule(fn, mesh=mesh, placement=tj.placements.mshape(4, mode),
                     num_microbatches=n, mode=mode, solver_time_limit_s=10.0)
  return step, step(params, batch)


def _check(shared, n=4, rows_per_mb=4, batch=None):
  """Train and infer equal the plain function; returns the infer pair
  (pipelined, reference) and the train step."""
  params = _params()
  batch = batch or _batch(n * rows_per_mb)
  fn = _chain(shared)
  step, (loss, grads) = _run(fn, params, batch, n, "train")
  ref_loss, ref_grads = M.reference(fn, params, batch, n)
  assert M.max_rel_err(loss, ref_loss) <= TOL
  assert M.max_rel_err(grads, ref_grads) <= TOL
  infer = _chain(shared, train=False)
  _, out = _run(infer, params, batch, n, "infer")
  want = M.reference_infer(infer, params, batch, n)
  assert M.max_rel_err(out[0], want[0]) <= TOL
  return step, out, want


def _mode_of_block0(step):
  return step.built.kernels.modes[0]


def test_batch_statistics_in_a_shared_block_are_exact():
  def batch_norm(p, h, batch):
    del p, batch
    c = h - h.mean(0)
    return c / jnp.sqrt((c * c).mean(0) + 1e-5), jnp.zeros(())
  step, out, want = _check(batch_norm)
  mode = _mode_of_block0(step)
  assert mode.mode == "replicated" and "reduce_sum" in mode.reason
  assert "replicated: reduce_sum over the batch axis" in step.grid()
  # Every device runs (and the cost model measures) all 4 rows.
  ks = step.built.kernels
  f0 = ks.kernels[ks.forward_ids[0]]
  assert f0.split == 1 and f0.in_avals[0].shape[0] == 4
  if step.report is not None:
    assert "replicated" in step.report.block_modes["F0"]


def test_dropout_in_a_shared_block_draws_the_plain_bits():
  def dropout(p, h, batch):
    del p, batch
    keep = jax.random.bernoulli(jax.random.PRNGKey(42), 0.7, h.shape)
    return jnp.where(keep, h / 0.7, 0.0), keep.astype(jnp.float32)
  step, out, want = _check(dropout)
  assert _mode_of_block0(step).mode == "replicated"
  assert "random_bits" in _mode_of_block0(step).reason
  np.testing.assert_array_equal(np.asarray(out[1]), np.asarray(want[1]))
  assert 0 < float(np.mean(out[1])) < 1


def test_dropout_with_row_keys_splits_and_keeps_the_bits():
  def dropout(p, h, batch):
    del p

    def row(k, r):
      keep = jax.random.bernoulli(jax.random.wrap_key_data(k), 0.7, r.shape)
      return jnp.where(keep, r / 0.7, 0.0), keep.astype(jnp.float32)
    return jax.vmap(row)(batch["key"], h)
  n = 4
  batch = _batch(n * 4)
  batch["key"] = jax.random.key_data(jax.random.split(jax.random.PRNGKey(5),
                                                      n * 4))
  step, out, want = _check(dropout, n=n, batch=batch)
  assert _mode_of_block0(step).mode == "split"
  np.testing.assert_array_equal(np.asarray(out[1]), np.asarray(want[1]))
  ks = step.built.kernels
  f0 = ks.kernels[ks.forward_ids[0]]
  assert f0.split == 4 and f0.in_avals[0].shape[0] == 1


def test_two_rows_on_four_devices_run_replicated():
  def plain(p, h, batch):
    del p, batch
    return h * 1.5, jnp.zeros(())
  step, _, _ = _check(plain, n=4, rows_per_mb=2)
  mode = _mode_of_block0(step)
  assert mode.mode == "replicated"
  assert mode.reason == "2 rows do not divide over 4 devices"


def test_vmapped_per_example_block_with_batch_last():
  def per_example(p, h, batch):
    del batch
    # Per-example code: W @ x; the shared block exports (hidden, batch).
    hb = jax.vmap(lambda r: jnp.tanh(p["w"][0] @ r), out_axes=1)(h)
    return hb.T, jnp.zeros(())

  def last_axis_boundary(p, batch):
    hb = jax.vmap(lambda r: jnp.tanh(p["w"][0] @ r), out_axes=1)(
        jnp.tanh(batch["x"] @ p["w"][0]))
    hb = tj.boundary(hb)                  # (hidden, rows) crosses the cut
    h = hb.T
    for i in range(1, 4):
      h = tj.boundary(jnp.tanh(h @ p["w"][i]) + h)
    return jnp.mean((h @ p["w"][4] - batch["y"]) ** 2)
  step, _, _ = _check(per_example)
  assert _mode_of_block0(step).mode == "split"
  params, n = _params(), 4
  batch = _batch(n * 4)
  step, (loss, grads) = _run(last_axis_boundary, params, batch, n, "train")
  ref_loss, ref_grads = M.reference(last_axis_boundary, params, batch, n)
  assert M.max_rel_err(loss, ref_loss) <= TOL
  assert M.max_rel_err(grads, ref_grads) <= TOL
  mode = _mode_of_block0(step)
  assert mode.mode == "replicated" and "axis 1" in mode.reason


@pytest.mark.parametrize("mode", ["train", "infer"])
def test_kshape_half_batch_join_without_padding(mode):
  from experiments import gpt_profile as G  # pylint: disable=import-outside-toplevel
  shape = G.GPTShape(vocab=32, d_model=8, layers=2, heads=2, seq=4, rows=4)
  groups = [(0, 1), (1, 2), (2, 4)]
  fn = G.branches_fn(shape, groups, "loss" if mode == "train" else "nll")
  params, n = G.init_params(shape), 4
  batch = {k: jnp.asarray(v) for k, v in G.make_batch(shape, n * 4).items()}
  mesh = jax.make_mesh((4,), ("pipe",))
  step = tj.schedule(fn, mesh=mesh, placement=tj.placements.kshape(4, mode),
                     num_microbatches=n, mode=mode, solver_time_limit_s=10.0)
  got = step(params, batch)
  want = (M.reference(fn, params, batch, n, jit=True) if mode == "train" else
          M.reference_infer(fn, params, batch, n))
  assert M.max_rel_err(got, want) <= TOL
  join = step.built.kernels.modes[4]
  assert join.mode == "replicated" and "block 0" in join.reason


@pytest.mark.parametrize("kw", [dict(split_backward=True),
                                dict(interpret_ramps=2)],
                         ids=["split_backward", "interp"])
def test_replicated_block_with_w_kernels_and_interp_segments(kw):
  def stats(p, h, batch):
    del batch
    return (h - h.mean(0)) * p["w"][0][0], jnp.zeros(())
  fn, params, n = _chain(stats), _params(), 4
  batch = _batch(n * 4)
  graph = tj.placements.mshape(4, "train", split_backward=kw.pop(
      "split_backward", False))
  step = tj.schedule(fn, mesh=jax.make_mesh((4,), ("pipe",)),
                     placement=graph, num_microbatches=n,
                     solver_time_limit_s=10.0, **kw)
  loss, grads = step(params, batch)
  ref_loss, ref_grads = M.reference(fn, params, batch, n)
  assert M.max_rel_err(loss, ref_loss) <= TOL
  assert M.max_rel_err(grads, ref_grads) <= TOL
  assert step.built.kernels.modes[0].mode == "replicated"
  if "interpret_ramps" in kw:
    assert any(s.kind == "interp" for s in step.built.plan.segments)
  else:
    assert any(k.kind == "W" and k.mode == "replicated"
               for k in step.built.kernels.kernels.values())


def _loss_last(kind):
  """4 blocks; the last one (on all devices) ends in a loss over the rows."""
  def fn(p, batch):
    h = batch["x"]
    for i in range(3):
      h = tj.boundary(jnp.tanh(h @ p["w"][i]) + h)
    err = (h @ p["w"][3] - batch["y"]) ** 2
    if kind == "mean":
      return jnp.mean(err)
    if kind == "sum":
      return jnp.sum(err) * 0.01
    return jnp.mean(err) + 0.1 * jnp.sum(p["w"][4] ** 2)   # affine: + const
  return fn


def _last_on_all_devices(fn):
  """``fn`` (4 blocks) trained with its last block on all 4 devices,
  checked against ``jax.value_and_grad``; the step."""
  params, n = _params(), 4
  batch = _batch(n * 4)
  step = tj.schedule(fn, mesh=jax.make_mesh((4,), ("pipe",)),
                     placement=tj.Placement([0, 1, 2, (0, 1, 2, 3)]),
                     num_microbatches=n, solver_time_limit_s=10.0)
  loss, grads = step(params, batch)
  ref_loss, ref_grads = M.reference(fn, params, batch, n)
  assert M.max_rel_err(loss, ref_loss) <= TOL
  assert M.max_rel_err(grads, ref_grads) <= TOL
  return step


@pytest.mark.parametrize("kind,mode", [("mean", "split"), ("sum", "split"),
                                       ("regularised", "replicated")])
def test_loss_block_on_all_devices_sums_partial_losses(kind, mode):
  step = _last_on_all_devices(_loss_last(kind))
  last = step.built.kernels.modes[3]
  assert last.mode == mode, last
  if mode == "split":
    assert last.summed == ((0, 0.25 if kind == "mean" else 1.0),)
    assert "partial sums" in step.grid()
  else:
    assert "reduce_sum over the batch axis, then add" in last.reason


def test_a_loss_block_taking_the_log_of_its_input_still_splits():
  # Block 3 reads a positive activation and takes its log: the probe's
  # signed example values give NaN there, its positive ones do not.
  def fn(p, batch):
    h = batch["x"]
    for i in range(2):
      h = tj.boundary(jnp.tanh(h @ p["w"][i]) + h)
    h = tj.boundary(jax.nn.sigmoid(h @ p["w"][2]))
    return -jnp.mean(jnp.log(h) + 0.1 * (h @ p["w"][3] - batch["y"]) ** 2)
  last = _last_on_all_devices(fn).built.kernels.modes[3]
  assert last.mode == "split" and last.summed == ((0, 0.25),), last


def test_partial_sums_in_infer_mode():
  fn, params, n = _loss_last("mean"), _params(), 4
  batch = _batch(n * 4)
  step = tj.schedule(fn, mesh=jax.make_mesh((4,), ("pipe",)),
                     placement=tj.Placement([0, 1, 2, (0, 1, 2, 3)]),
                     num_microbatches=n, mode="infer",
                     solver_time_limit_s=10.0)
  out = step(params, batch)
  want = M.reference_infer(fn, params, batch, n)
  assert out.shape == (n,) and M.max_rel_err(out, want) <= TOL
  assert step.built.kernels.modes[3].summed == ((0, 0.25),)
