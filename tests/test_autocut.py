"""The automatic cut: DP optimality, liveness, jaxpr rewriting, real models.

The DP is checked against brute-force enumeration of every contiguous cut;
hand-made jaxprs have known best cuts; unmarked plain-JAX, Flax nnx and
Equinox GPTs are cut, partitioned and (through ``autocut.with_cut``)
scheduled and compared with ``jax.value_and_grad``.
"""

from __future__ import annotations

import functools
import inspect
import itertools
import types

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import tessel_jax as tj
from experiments import autocut_bench_lib as bench
from tessel_jax import api as _api
from tessel_jax import compat
from tessel_jax.api import TesselError
from tessel_jax.passes import autocut, autocut_cost, cut_dp
from tessel_jax.passes import partition as _partition
from tessel_jax.passes import tracing as _tracing

TOL = 1e-5
_OPTIONS = inspect.signature(_api.schedule).parameters
_HOOKED = "cut" in _OPTIONS   # tj.schedule has the automatic-cut hook


def _trace(fn, params, batch, name="f"):
  return _tracing.trace(fn, name, params, batch)


@functools.partial(jax.jit, static_argnums=0)
def _run_blocks(part, params, batch):
  """Evaluates a partition block by block (chain), returns the outputs."""
  p_leaves = jax.tree_util.tree_leaves(params)
  b_leaves = jax.tree_util.tree_leaves(batch)
  outs = {}
  for blk in part.blocks:
    args = []
    for s in blk.inputs:
      if s.kind == "param":
        args.append(p_leaves[s.index])
      elif s.kind == "batch":
        args.append(b_leaves[s.index])
      else:
        args.append(outs[s.index][s.output])
    outs[blk.index] = blk(*args)
  terms = [outs[t.index][t.output] for t in part.epilogue.terminals]
  return part.epilogue(*terms)


def _global_rel_err(got, want):
  """max |a - b| over all leaves / max |b| over all leaves.

  Flax's attention key bias has a zero gradient (softmax ignores a shift),
  so a per-leaf relative error would compare rounding noise.
  """
  diff = max(float(np.max(np.abs(np.asarray(a, np.float64) -
                                 np.asarray(b, np.float64))))
             for a, b in zip(jax.tree_util.tree_leaves(got),
                             jax.tree_util.tree_leaves(want)))
  scale = max(float(np.max(np.abs(np.asarray(b, np.float64))))
              for b in jax.tree_util.tree_leaves(want))
  return diff / max(scale, 1e-30)


def _leaf_rel_err(got, want):
  """Largest max|a - b| / max|b| over the leaves (as in test_lowering)."""
  return max(
      float(np.max(np.abs(np.asarray(a, np.float64) -
                          np.asarray(b, np.float64)))) /
      max(float(np.max(np.abs(np.asarray(b, np.float64)))), 1e-30)
      for a, b in zip(jax.tree_util.tree_leaves(got),
                      jax.tree_util.tree_leaves(want)))


def _small(name, **kw):
  sizes = dict(layers=1, d_model=8, heads=2, vocab=16, seq=4, rows=4)
  sizes.update(kw)
  return _built(name, tuple(sorted(sizes.items())))


@functools.lru_cache(maxsize=None)
def _built(name, sizes):
  return bench.BUILDERS[name](**dict(sizes))


# --- the dynamic programme ----------------------------------------------------


@settings(max_examples=150, deadline=None)
@given(st.lists(st.integers(0, 9), min_size=1, max_size=10), st.data())
def test_dp_equals_brute_force(costs, data):
  n = len(costs)
  k = data.draw(st.integers(1, min(n, 5)))
  weights = data.draw(st.none() | st.lists(
      st.sampled_from([0.5, 1.0, 2.0]), min_size=k, max_size=k))
  live = data.draw(st.lists(st.integers(0, 50), min_size=n + 1,
                            max_size=n + 1))
  pos, best = cut_dp.optimal_cuts(costs, live, k, tolerance=0.0,
                                   weights=weights)
  _, brute = cut_dp.brute_force_cuts(costs, k, weights=weights)
  assert best == pytest.approx(brute)
  assert len(pos) == k - 1 and list(pos) == sorted(set(pos))
  assert all(0 < p < n for p in pos)
  assert max(cut_dp.block_costs(costs, pos, weights)) == pytest.approx(brute)
  # Fewest live bytes among the balanced cuts.
  w = np.ones(k) if weights is None else np.asarray(weights)
  s = np.concatenate([[0], np.cumsum(costs)])
  fewest = min(
      sum(live[p] for p in cut)
      for cut in itertools.combinations(range(1, n), k - 1)
      if max(w[j] * (s[b] - s[a]) for j, (a, b) in
             enumerate(zip((0,) + cut, cut + (n,)))) <= brute + 1e-9)
  assert sum(live[p] for p in pos) == fewest


def test_dp_within_tolerance_prefers_fewer_bytes():
  costs = [10, 10, 10, 10, 2, 10, 10, 10, 8]
  live = [0, 5, 5, 5, 100, 1, 5, 5, 5, 0]
  exact, best = cut_dp.optimal_cuts(costs, live, 2, tolerance=0.0)
  assert exact == (4,) and best == 40
  loose, _ = cut_dp.optimal_cuts(costs, live, 2, tolerance=0.10)
  assert loose == (5,)   # busiest 42 <= 44, 1 byte live instead of 100
  assert max(cut_dp.block_costs(costs, loose)) <= best * 1.10


def test_dp_within_ten_percent_of_exhaustive_with_noisy_costs():
  rng = np.random.default_rng(0)
  for _ in range(30):
    n, k = int(rng.integers(8, 14)), int(rng.integers(2, 5))
    true = rng.uniform(0.1, 1.0, n)
    noisy = true * rng.uniform(0.97, 1.03, n)   # a 3% cost model error
    pos, _ = cut_dp.optimal_cuts(noisy, np.zeros(n + 1), k)
    _, best = cut_dp.brute_force_cuts(true, k)
    assert max(cut_dp.block_costs(true, pos)) <= 1.10 * best
    exact, _ = cut_dp.optimal_cuts(true, np.zeros(n + 1), k, tolerance=0.0)
    assert max(cut_dp.block_costs(true, exact)) == pytest.approx(best)


def test_dp_on_a_small_gpt_matches_exhaustive_search():
  model = _small("plain")
  flat = autocut.flatten(bench.trace(model))
  true, _ = autocut.eqn_costs(flat, cost="analytic")
  noisy = true * np.random.default_rng(2).uniform(0.95, 1.05, len(true))
  live = autocut.live_bytes(flat)
  for k in (2, 3):
    _, best = cut_dp.brute_force_cuts(true, k)
    exact, _ = cut_dp.optimal_cuts(true, live, k, tolerance=0.0)
    assert max(cut_dp.block_costs(true, exact)) == pytest.approx(best)
    pos, _ = cut_dp.optimal_cuts(noisy, live, k)
    assert max(cut_dp.block_costs(true, pos)) <= 1.10 * best


def test_dp_input_errors():
  with pytest.raises(ValueError, match="non-empty blocks"):
    cut_dp.optimal_cuts([1, 2], [0, 0, 0], 3)
  with pytest.raises(ValueError, match=">= 0"):
    cut_dp.optimal_cuts([1, -2], [0, 0, 0], 2)
  with pytest.raises(ValueError, match="weights"):
    cut_dp.optimal_cuts([1, 2], [0, 0, 0], 2, weights=[1.0])


def test_dp_is_fast_enough_for_large_jaxprs():
  # Not a timing assertion: the vectorised DP handles 1000 equations.
  costs = np.random.default_rng(1).uniform(0, 1, 1000)
  pos, best = cut_dp.optimal_cuts(costs, np.zeros(1001), 8)
  assert len(pos) == 7
  assert max(cut_dp.block_costs(costs, pos)) <= best * (
      1 + cut_dp.DEFAULT_TOLERANCE) + 1e-9


# --- hand-made jaxprs ---------------------------------------------------------


def _matmul_chain(widths):
  """x -> tanh(x @ W_i) for matrices of the given output widths."""
  dims = [8] + list(widths)
  params = [jnp.ones((a, b)) / a for a, b in zip(dims, dims[1:])]

  def chain(p, batch):
    h = batch["x"]
    for w in p:
      h = jnp.tanh(h @ w)
    return jnp.sum(h)

  return chain, params, {"x": jnp.ones((16, 8))}


def _dot_positions(closed):
  return [i for i, e in enumerate(closed.jaxpr.eqns)
          if compat.primitive_name(e) == "dot_general"]


def test_chain_of_matmuls_cut_where_brute_force_says():
  fn, params, batch = _matmul_chain([256, 8, 8, 8, 8, 8])
  traced = _trace(fn, params, batch)
  flat = autocut.flatten(traced)
  costs, _ = autocut.eqn_costs(flat, cost="analytic")
  for k in (2, 3, 4):
    cut = autocut.cut_to(traced, k, cost="analytic", tolerance=0.0)
    info = autocut.cut_info(cut)
    _, best = cut_dp.brute_force_cuts(costs, k)
    assert info.max_cost == pytest.approx(best)
    assert cut.num_blocks == k
  # The 8x256 and 256x8 products dominate: with 2 blocks they are split.
  cut = autocut.cut_to(traced, 2, cost="analytic")
  dots = _dot_positions(flat)
  assert dots[0] < autocut.cut_info(cut).positions[0] <= dots[1]


def test_given_costs_equal_block_sizes():
  fn, params, batch = _matmul_chain([8] * 6)
  traced = _trace(fn, params, batch)
  flat = autocut.flatten(traced)
  dots = _dot_positions(flat)
  costs = [1.0 if i in dots else 0.0 for i in range(len(flat.jaxpr.eqns))]
  cut = autocut.cut_to(traced, 3, cost=costs, tolerance=0.0)
  pos = autocut.cut_info(cut).positions
  per_block = [sum(1 for d in dots if a <= d < b)
               for a, b in zip((0,) + pos, pos + (len(costs),))]
  assert per_block == [2, 2, 2]


def test_ties_cut_where_few_bytes_are_live():
  # Cost only in the dots: any cut between the 2nd and 3rd dot balances;
  # the wide (16 x 512) intermediate between them must not cross the cut.
  def wide(p, batch):
    h = jnp.tanh(batch["x"] @ p[0])            # (16, 8)
    h = jnp.tanh(h @ p[1])                     # (16, 8)
    big = jnp.tile(h, (1, 64)) * 2.0           # (16, 512), cost-free here
    small = big.reshape(16, 64, 8).sum(1)      # (16, 8)
    h = jnp.tanh(small @ p[2])
    return jnp.sum(jnp.tanh(h @ p[3]))

  params = [jnp.ones((8, 8)) / 8] * 4
  traced = _trace(wide, params, {"x": jnp.ones((16, 8))})
  flat = autocut.flatten(traced)
  dots = _dot_positions(flat)
  costs = [1.0 if i in dots else 0.0 for i in range(len(flat.jaxpr.eqns))]
  live = autocut.live_bytes(flat)
  cut = autocut.cut_to(traced, 2, cost=costs, tolerance=0.0)
  (p,), = [autocut.cut_info(cut).positions]
  ties = range(dots[1] + 1, dots[2] + 1)
  assert p in ties
  assert live[p] == min(live[q] for q in ties)
  assert live[p] < max(live[q] for q in ties)
  assert live[p] == 16 * 8 * 4


def test_live_bytes_excludes_inputs_counts_skip_connections():
  def skip(p, batch):
    a = batch["x"] * 2.0          # 0: a live until the add
    b = jnp.tanh(a)               # 1
    c = b @ p                     # 2
    return jnp.sum(c + a)         # 3: add, 4: reduce_sum

  traced = _trace(skip, jnp.ones((4, 4)), {"x": jnp.ones((2, 4))})
  live = autocut.live_bytes(traced.closed_jaxpr)
  f32 = 2 * 4 * 4
  assert list(live) == [0, f32, 2 * f32, 2 * f32, f32, 4]


def test_flatten_inlines_nested_jit_and_drops_markers():
  @jax.jit
  def inner(w, h):
    return jnp.tanh(h @ w)

  def nested(p, batch):
    h = inner(p[0], batch["x"])
    h = tj.boundary(h)
    return jnp.sum(jax.jit(lambda q, y: inner(q, y) * 2)(p[1], h))

  params = [jnp.ones((8, 8)) / 8] * 2
  batch = {"x": jnp.ones((4, 8))}
  traced = _trace(nested, params, batch)
  flat = autocut.flatten(traced)
  names = [compat.primitive_name(e) for e in flat.jaxpr.eqns]
  assert "jit" not in names and "pjit" not in names
  assert "tessel_boundary" not in names
  assert names.count("dot_general") == 2
  cut = autocut.cut_to(traced, 3, cut="auto", cost="analytic")
  part = _partition.partition(cut)
  assert len(part.blocks) == 3
  got = _run_blocks(part, params, batch)
  np.testing.assert_allclose(got[0], nested(params, batch), rtol=1e-6)


def test_whole_function_under_jit_is_cut():
  fn, params, batch = _matmul_chain([8] * 4)
  traced = _trace(jax.jit(fn), params, batch)
  assert len(traced.closed_jaxpr.jaxpr.eqns) == 1
  cut = autocut.cut_to(traced, 4, cost="analytic")
  assert len(_partition.partition(cut).blocks) == 4


# --- cut_to modes and errors --------------------------------------------------


def test_markers_mode_and_mismatch_errors():
  def marked(p, batch):
    h = jnp.tanh(batch["x"] @ p[0])
    h = tj.boundary(h)
    return jnp.sum(jnp.tanh(h @ p[1]))

  params = [jnp.ones((8, 8))] * 2
  batch = {"x": jnp.ones((4, 8))}
  traced = _trace(marked, params, batch, "marked")
  assert autocut.cut_to(traced, 2) is traced
  assert autocut.cut_to(traced, 2, cut="markers") is traced
  with pytest.raises(TesselError, match=r"'marked'.*2 blocks \(1 tj.boundary"
                     r" calls\).*needs 3 forward blocks; add 1 tj.boundary"
                     r" call.*cut='auto'"):
    autocut.cut_to(traced, 3, what="placement 'vshape.train.d3'")
  with pytest.raises(TesselError, match="remove 1 tj.boundary call"):
    autocut.cut_to(traced, 1, cut="markers")
  auto = autocut.cut_to(traced, 3, cut="auto", cost="analytic")
  assert auto.num_blocks == 3 and autocut.cut_info(auto) is not None
  with pytest.raises(TesselError, match="cut='sometimes'"):
    autocut.cut_to(traced, 2, cut="sometimes")


def test_too_few_equations():
  def tiny(p, batch):
    return jnp.sum(batch["x"] * p)

  traced = _trace(tiny, jnp.ones(()), {"x": jnp.ones((4,))}, "tiny")
  with pytest.raises(TesselError, match=r"'tiny'.*needs 5 forward blocks but"
                     r" the function has only 2 top-level operations"):
    autocut.cut_to(traced, 5, cost="analytic")


def test_scan_is_cut_at_iteration_boundaries():
  def scanned(p, batch):
    h, _ = jax.lax.scan(lambda c, w: (jnp.tanh(c @ w), None), batch["x"], p)
    return jnp.sum(h)

  params = jnp.ones((6, 8, 8)) / 8
  traced = _trace(scanned, params, {"x": jnp.ones((4, 8))}, "scanned")
  cut = autocut.cut_to(traced, 3, cost="analytic")
  lengths = [compat.scan_layout(e)[0] for e in cut.closed_jaxpr.jaxpr.eqns
             if compat.is_scan(e)]
  assert lengths == [2, 2, 2]   # two layers per block (passes.scan_split)
  with pytest.raises(TesselError, match="a scan one per iteration"):
    autocut.cut_to(traced, 12, cost="analytic")


def test_no_markers_one_block_is_unchanged():
  fn, params, batch = _matmul_chain([8, 8])
  traced = _trace(fn, params, batch)
  assert autocut.cut_to(traced, 1) is traced


def test_like_reuses_cut_and_aligns_size_one_batches():
  model = _small("plain")
  traced = bench.trace(model)
  cut = autocut.cut_to(traced, 4, cost="analytic")
  info = autocut.cut_info(cut)
  part = _partition.partition(cut)
  for rows in (2, 1):   # 1 row: jnp.matmul squeezes the batch -> alignment
    mb = jax.tree_util.tree_map(lambda x, r=rows: x[:r], model.batch)
    again = autocut.cut_to(bench.trace(model._replace(batch=mb)), 4,
                           like=cut)
    assert autocut.cut_info(again) is info
    local = _partition.partition(again)
    assert [b.inputs for b in local.blocks] == [b.inputs for b in part.blocks]
    assert [len(b.outvars) for b in local.blocks] == [
        len(b.outvars) for b in part.blocks]


def test_like_with_different_structure_raises():
  fn, params, batch = _matmul_chain([8] * 4)
  cut = autocut.cut_to(_trace(fn, params, batch), 3, cost="analytic")
  other, oparams, obatch = _matmul_chain([8] * 2)
  with pytest.raises(TesselError, match="different equation structure|"
                     "equations around a cut differ"):
    autocut.cut_to(_trace(other, oparams, obatch), 3, like=cut)


# --- costs --------------------------------------------------------------------


def test_analytic_costs_count_matmul_flops():
  fn, params, batch = _matmul_chain([32])
  flat = autocut.flatten(_trace(fn, params, batch))
  costs = autocut_cost.analytic_costs(flat.jaxpr.eqns)
  dot = _dot_positions(flat)[0]
  assert costs[dot].flops == 2 * 16 * 8 * 32
  assert costs[dot].bytes == 4 * (16 * 8 + 8 * 32 + 16 * 32)


def test_find_period_and_group_alignment():
  keys = list("ab") + list("xyz") * 5 + list("q")
  assert autocut_cost.find_period(keys) == (2, 3, 5)
  assert autocut_cost.find_period(list("abcdef")) == (0, 0, 0)
  model = _small("plain", layers=3)
  flat = autocut.flatten(bench.trace(model))
  eqns = flat.jaxpr.eqns
  est = autocut_cost.roofline_seconds(autocut_cost.analytic_costs(eqns))
  bounds = autocut_cost.group_bounds(eqns, est, 8)
  assert bounds[0][0] == 0 and bounds[-1][1] == len(eqns)
  assert all(a < b for a, b in bounds)
  assert all(b == c for (_, b), (c, _) in zip(bounds, bounds[1:]))


def test_measured_costs_time_distinct_groups_once():
  fn, params, batch = _matmul_chain([8] * 6)
  traced = _trace(fn, params, batch)
  flat = autocut.flatten(traced)
  m = autocut_cost.measured_costs(flat, train=True, num_groups=4, repeats=2,
                                  min_seconds=0.0)
  assert m.seconds.shape == (len(flat.jaxpr.eqns),)
  assert np.all(m.seconds >= 0) and m.seconds.sum() > 0
  assert m.timed < len(m.groups)      # identical layers share their groups
  again = autocut_cost.measured_costs(flat, train=True, num_groups=4)
  assert again.timed == 0             # cached
  cut = autocut.cut_to(traced, 3)     # default: measured
  assert autocut.cut_info(cut).cost_source == "measured"


def test_measured_groups_compiled_as_they_are_lowered(monkeypatch):
  """Every group to time goes through one ``compile_pool.compile_pipelined``
  call (each compiled as soon as it is lowered, all before any is timed)."""
  from tessel_jax.cost import compile_pool  # pylint: disable=import-outside-toplevel
  batches: list[int] = []
  real = compile_pool.compile_pipelined
  monkeypatch.setattr(compile_pool, "compile_pipelined",
                      lambda keys, lower, workers=None: batches.append(
                          len(keys)) or real(keys, lower, workers))
  monkeypatch.setattr(autocut_cost, "_GROUP_CACHE", {})
  fn, params, batch = _matmul_chain([8, 16, 8, 16, 8, 16])
  flat = autocut.flatten(_trace(fn, params, batch))
  m = autocut_cost.measured_costs(flat, train=True, num_groups=4, repeats=2,
                                  min_seconds=0.0)
  assert m.timed >= 2 and batches == [m.timed]
  assert np.all(m.seconds >= 0) and m.seconds.sum() > 0



def _sliced_first_layer():
  """Six 128-wide layers; the first reads a 128 x 128 slice of a 1024 x
  1024 parameter (as a dead-tap convolution reads its live tap): work the
  lowering hoists out of the ticks (``passes.param_only``)."""
  params = {"big": jnp.ones((1024, 1024)) / 128,
            "w": [jnp.ones((128, 128)) / 128 for _ in range(5)]}

  def fn(p, batch):
    h = jnp.tanh(batch["x"] @ p["big"][:128, :128])
    for w in p["w"]:
      h = jnp.tanh(h @ w)
    return jnp.sum(h)

  return fn, params, {"x": jnp.ones((8, 128))}


def test_hoisted_parameter_work_is_not_priced_per_microbatch():
  # Priced per micro-batch, the 4 MiB slice (roofline: ~0.8 ms against
  # ~16 us per layer) made the first block [slice, layer 0] alone; the
  # program slices once per step, so the cut balances the six layers.
  fn, params, batch = _sliced_first_layer()
  traced = _trace(fn, params, batch)
  flat = autocut.flatten(traced)
  hoisted = autocut.hoisted_eqns(flat, len(traced.param_avals))
  assert [compat.primitive_name(e) for e, h in zip(flat.jaxpr.eqns, hoisted)
          if h] == ["slice"]
  assert not autocut.hoisted_eqns(flat, None).any()
  costs, _ = autocut.eqn_costs(flat, cost="analytic",
                               num_params=len(traced.param_avals))
  assert costs[hoisted].sum() == 0 and costs.sum() > 0
  info = autocut.cut_info(autocut.cut_to(traced, 2, cut="auto",
                                         cost="analytic"))
  dots = _dot_positions(flat)
  assert sum(d < info.positions[0] for d in dots) == 3, info.describe()


def test_measured_groups_read_hoisted_values_as_inputs():
  fn, params, batch = _sliced_first_layer()
  traced = _trace(fn, params, batch)
  flat = autocut.flatten(traced)
  hoisted = autocut.hoisted_eqns(flat, len(traced.param_avals))
  m = autocut_cost.measured_costs(flat, train=True, num_groups=2, repeats=2,
                                  min_seconds=0.0, per_step=hoisted)
  assert m.seconds[hoisted].sum() == 0 and m.seconds.sum() > 0
  with pytest.raises(ValueError, match="per_step has 1 entries"):
    autocut_cost.measured_costs(flat, per_step=[True])

def test_cut_prices_parameter_work_per_microbatch_where_not_hoisted():
  # With Switches(hoist=False) (or one micro-batch) the kernels slice the
  # big parameter at every tick: the cut must price it per micro-batch
  # ([slice, layer 0] | 5 layers), not once per step (3 | 3 layers).
  from tessel_jax.passes import switches as _switches
  fn, params, batch = _sliced_first_layer()
  traced = _trace(fn, params, batch)
  dots = _dot_positions(autocut.flatten(traced))
  per_mb = autocut.cut_info(autocut.cut_to(traced, 2, cut="auto",
                                           cost="analytic", hoist=False))
  assert sum(d < per_mb.positions[0] for d in dots) == 1, per_mb.describe()
  model = types.SimpleNamespace(
      fn=fn, params=params, batch={"x": jnp.ones((8, 128)) / 4})
  first = {}
  for hoist in (False, True):
    step = _check_schedule(fn, model, "vshape", 2, devices=2, cut="auto",
                           switches=_switches.Switches(hoist=hoist))
    info = autocut.cut_info(step.built.partition.traced)
    first[hoist] = sum(d < info.positions[0] for d in dots)
  assert first == {False: 1, True: 3}, first


# --- real models --------------------------------------------------------------


@pytest.mark.parametrize("name", ["plain", "flax", "equinox"])
def test_unmodified_models_are_cut_and_partitioned(name):
  if name != "plain":
    pytest.importorskip(name)
  model = _small(name)
  traced = bench.trace(model)
  assert traced.num_blocks == 1
  for k in (2, 5):
    cut = autocut.cut_to(traced, k, cost="analytic")
    part = _partition.partition(cut)
    assert len(part.blocks) == k
    assert all(b.eqns for b in part.blocks)
  got = _run_blocks(part, model.params, model.batch)[0]
  want = jax.jit(model.fn)(model.params, model.batch)
  np.testing.assert_allclose(got, want, rtol=1e-5)


@pytest.mark.parametrize("name", ["plain", "flax", "equinox"])
def test_with_cut_keeps_values_and_gradients(name):
  if name != "plain":
    pytest.importorskip(name)
  model = _small(name)
  marked = autocut.with_cut(model.fn, model.params, model.batch, 4,
                            cost="analytic")
  assert marked.autocut.num_blocks == 4
  assert _trace(marked, model.params, model.batch).num_blocks == 4

  @jax.jit
  def both(params, batch):
    return (jax.value_and_grad(marked)(params, batch),
            jax.value_and_grad(model.fn)(params, batch))

  got, want = both(model.params, model.batch)
  assert _global_rel_err(got, want) <= TOL


def _check_schedule(fn, model, placement, n, devices=4, **kw):
  if "cost" in _OPTIONS:
    kw.setdefault("cost", "uniform")   # no kernel profiling: a fast test
  mesh = jax.make_mesh((devices,), ("pipe",))
  step = tj.schedule(fn, mesh=mesh, placement=placement, num_microbatches=n,
                     solver_time_limit_s=10.0, **kw)
  loss, grads = step(model.params, model.batch)
  ref_loss, ref_grads = jax.jit(jax.value_and_grad(
      lambda p: jnp.mean(jnp.stack([
          model.fn(p, jax.tree_util.tree_map(
              lambda x, m=m: x.reshape((n, -1) + x.shape[1:])[m],
              model.batch)) for m in range(n)]))))(model.params)
  assert _leaf_rel_err(loss, ref_loss) <= TOL
  assert _leaf_rel_err(grads, ref_grads) <= TOL
  return step


@pytest.mark.skipif(_HOOKED, reason="the tj.schedule test below covers it")
def test_unmarked_plain_model_scheduled_through_with_cut():
  model = _small("plain", rows=4)
  n = 2
  mb = jax.tree_util.tree_map(lambda x: x[:4 // n], model.batch)
  marked = autocut.with_cut(model.fn, model.params, mb, 2, cost="analytic")
  _check_schedule(marked, model, tj.placements.vshape(2), n, devices=2)


@pytest.mark.skipif(not _HOOKED, reason="tj.schedule has no cut= option yet")
def test_unmarked_plain_model_scheduled_by_tj_schedule():
  model = _small("plain", rows=8)
  step = _check_schedule(model.fn, model, "vshape", 4)     # no markers: auto
  assert len(step.built.partition.blocks) == 4
  assert autocut.cut_info(step.built.partition.traced) is not None
  # cut="auto" ignores markers; cut="markers" insists on them.
  marked = autocut.with_cut(model.fn, model.params, model.batch, 2,
                            cost="analytic")
  mesh = jax.make_mesh((4,), ("pipe",))
  fast = {"cost": "uniform"} if "cost" in _OPTIONS else {}
  auto = tj.schedule(marked, mesh=mesh, placement="vshape",
                     num_microbatches=4, cut="auto", **fast)
  assert len(auto.build(model.params, model.batch).partition.blocks) == 4
  strict = tj.schedule(marked, mesh=mesh, placement="vshape",
                       num_microbatches=4, cut="markers", **fast)
  with pytest.raises(TesselError, match="2 blocks"):
    strict.build(model.params, model.batch)


def test_benchmark_best_group_cut_and_table():
  times = [1.0, 3.0, 1.0, 1.0, 2.0]
  bounds = [(0, 2), (2, 5), (5, 6), (6, 9), (9, 10)]
  pos, best, method = bench.best_group_cut(times, bounds, 2)
  assert (pos, best, method) == ((5,), 4.0, "enumerated")
  row = {"model": "plain", "blocks": 2, "eqns": 10, "cut_seconds": 0.1,
         "dp_max_ms": 4.0, "best_max_ms": 4.0, "ratio": 1.0,
         "dp_vs_own_optimum": 1.0}
  text = bench.table({"cases": [row],
                      "gpt12_cut_seconds": {"eqns": 10, "cold": 1.0,
                                            "warm": 0.1}})
  assert "worst ratio 1.000" in text and "12-layer GPT" in text
