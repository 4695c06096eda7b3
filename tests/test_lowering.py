"""tj.schedule end to end: value + grad equal jax.value_and_grad (8 CPU devices).

Every case lowers a searched (or baseline) schedule to one shard_map program
and compares loss and gradients with ``jax.value_and_grad`` of the mean over
micro-batches (relative error <= 1e-5), or the inference outputs with the
plain function's.
"""

from __future__ import annotations

import re

import jax
import numpy as np
import pytest

import tessel_jax as tj
from tessel_jax.schedule import UnrolledSchedule
from tessel_jax.search.list_schedule import best_list_schedule

import test_lowering_models as M

TOL = 1e-5
SOLVER_S = 20.0


def _chain_kinds(num_forward: int) -> list[str]:
  kinds = ["embed"] + ["layer"] * (num_forward - 2) + ["head"]
  if num_forward >= 4:
    kinds[1] = "mixed"   # bfloat16 activation + per-example gate cross a boundary
  return kinds


def _model(graph):
  """A model whose block structure fits ``graph``."""
  n_fwd = sum(1 for b in graph.blocks if b.kind == "F")
  shape = graph.name.split(".")[0]
  if shape == "xshape":
    per = n_fwd // 2
    return M.two_tower_fn(per), M.make_params(2 * (per - 1))
  if shape == "kshape":
    half = graph.num_devices // 2
    return M.k_fn(half), M.make_params(2 * (half - 1) + 1)
  kinds = _chain_kinds(n_fwd)
  return M.chain_fn(kinds), M.make_params(M.num_layers(kinds))


def _check_train(graph, n, rows_per_mb=4, plan=None, mesh=None, **kw):
  fn, params = _model(graph)
  batch = M.make_batch(n * rows_per_mb)
  mesh = mesh or jax.make_mesh((graph.num_devices,), ("pipe",))
  step = tj.schedule(fn, mesh=mesh, placement=graph, num_microbatches=n,
                     plan=plan, solver_time_limit_s=SOLVER_S, **kw)
  loss, grads = step(params, batch)
  ref_loss, ref_grads = M.reference(fn, params, batch, n)
  assert M.max_rel_err(loss, ref_loss) <= TOL
  assert M.max_rel_err(grads, ref_grads) <= TOL
  assert jax.tree_util.tree_structure(grads) == jax.tree_util.tree_structure(
      params)
  return step


@pytest.mark.parametrize("graph", [
    tj.placements.vshape(4),
    tj.placements.interleaved(2, chunks=2),
    tj.placements.xshape(4),
    tj.placements.mshape(4),
    tj.placements.kshape(4),
    tj.placements.nnshape(2),
    tj.placements.zbv(2),                 # split backward: B and W blocks
], ids=lambda g: g.name)
def test_searched_schedule_matches_value_and_grad(graph):
  # N at least twice the repetend's micro-batch offset, so the searched
  # warmup/cooldown templates apply (smaller N runs a slower CP-SAT
  # completion of every action).
  n = 12 if graph.name.startswith("mshape") else 8
  step = _check_train(graph, n=n)
  assert step.schedule is not None and step.schedule.period >= 1
  assert step.unrolled.num_microbatches == n


def test_list_schedule_matches_value_and_grad():
  # A non-periodic schedule (Schedule.unroll's list alternative: GPipe-like
  # with interleaved chunks) lowers like any other action list.
  graph = tj.placements.interleaved(4, chunks=2, f_span=1, b_span=2)
  actions = best_list_schedule(graph, 8, None)
  given = UnrolledSchedule(graph=graph, num_microbatches=8, actions=actions)
  step = _check_train(graph, n=8, plan=given)
  assert step.unrolled.actions == actions


@pytest.mark.parametrize("baseline", ["gpipe", "1f1b"])
def test_baselines_match_value_and_grad(baseline):
  step = _check_train(tj.placements.vshape(4), n=8, plan=baseline,
                      interpret_ramps=8)  # the loop lowering
  assert step.schedule is None
  assert step.unrolled.source == baseline
  # GPipe runs a forward loop and a backward loop; 1F1B one steady loop.
  loops = [s for s in step.built.plan.segments if s.is_loop]
  assert loops, step.built.plan.loop_summary()


@pytest.mark.parametrize("baseline", ["dualpipev", "zbv"])
def test_v_baselines_match_value_and_grad(baseline):
  step = _check_train(tj.placements.zbv(2), n=4, plan=baseline)
  assert step.unrolled.source == baseline


@pytest.mark.parametrize("n", [1, 3, 64])
def test_number_of_microbatches(n):
  _check_train(tj.placements.vshape(2), n=n, rows_per_mb=2)


def test_recompute_matches_and_shrinks_the_stash():
  graph = tj.placements.vshape(2)
  keep = _check_train(graph, n=4)
  remat = _check_train(graph, n=4, recompute=True)
  assert remat.built.kernels.keep == {0: False, 1: False}
  f_keep = [k.stash_bytes for k in keep.built.kernels.kernels.values()
            if k.kind == "F"]
  f_remat = [k.stash_bytes for k in remat.built.kernels.kernels.values()
             if k.kind == "F"]
  assert sum(f_remat) < sum(f_keep)


@pytest.mark.parametrize("graph", [tj.placements.vshape(4),
                                   tj.placements.mshape(4)],
                         ids=lambda g: g.name)
def test_inference_outputs_equal(graph):
  n_fwd = sum(1 for b in graph.blocks if b.kind == "F")
  kinds = _chain_kinds(n_fwd)
  base = M.chain_fn(kinds)

  def logits_and_loss(params, batch):
    return base(params, batch), batch["tokens"][:, 0] * 2

  params = M.make_params(M.num_layers(kinds))
  n = 4
  batch = M.make_batch(n * 4)
  mesh = jax.make_mesh((graph.num_devices,), ("pipe",))
  step = tj.schedule(logits_and_loss, mesh=mesh, placement=graph,
                     num_microbatches=n, mode="infer",
                     solver_time_limit_s=SOLVER_S)
  out = step(params, batch)
  want = M.reference_infer(logits_and_loss, params, batch, n)
  assert out[0].shape == (n,) and out[1].shape == (n * 4,)
  assert M.max_rel_err(out[0], want[0]) <= TOL
  np.testing.assert_array_equal(out[1], want[1])
  assert all(b.kind == "F" for b in step.unrolled.graph.blocks)


def test_decorator_hand_placement_lower_and_compile():
  mesh = jax.make_mesh((2,), ("pipe",))
  kinds = ["embed", "layer", "head"]
  fn = M.chain_fn(kinds)

  @tj.schedule(mesh=mesh, placement=tj.Placement([(0, 1), 0, 1]),
               num_microbatches=4, solver_time_limit_s=SOLVER_S)
  def step(params, batch):
    return fn(params, batch)

  params = M.make_params(2)
  batch = M.make_batch(16)
  compiled = step.lower(params, batch).compile()
  loss, grads = compiled(params, batch)
  ref_loss, ref_grads = M.reference(fn, params, batch, 4)
  assert M.max_rel_err(loss, ref_loss) <= TOL
  assert M.max_rel_err(grads, ref_grads) <= TOL
  assert step.__name__ == "step"
  assert "dev0" in step.grid()
  # Each device holds only the parameters of its own blocks: device 0 runs
  # the embedding (shared) and layer 0, not layer 1.
  per_device = step.built.layout.bytes_per_device()
  size = lambda x: int(np.prod(x.shape)) * 4
  assert per_device[0] == size(params["wte"]) + sum(
      size(x) for x in jax.tree_util.tree_leaves(params["layers"][0]))


def test_data_parallel_axis_beside_the_pipe_axis():
  mesh = jax.make_mesh((2, 2), ("data", "pipe"))
  step = _check_train(tj.placements.vshape(2), n=4, mesh=mesh)
  txt = step.lower(*_args_for(step)).compile().as_text()
  # Gradients (and the loss terms) are reduced once per step, not per
  # micro-batch.
  assert len(re.findall(r"all-reduce(?:-start)?\(", txt)) <= 2
  assert step.unrolled.num_microbatches == 2      # 4 micro-batches / 2 replicas


def _args_for(step):
  part = step.built.partition
  params = jax.tree_util.tree_unflatten(
      part.traced.param_tree,
      [np.zeros(a.shape, a.dtype) for a in part.traced.param_avals])
  n = step.num_microbatches
  batch = jax.tree_util.tree_unflatten(
      part.traced.batch_tree,
      [np.zeros((a.shape[0] * n,) + a.shape[1:], a.dtype)
       for a in part.traced.batch_avals])
  return params, batch


def test_loop_keeps_compile_size_flat_in_n():
  """The steady state is a fori_loop: the program does not grow with N."""
  graph = tj.placements.vshape(2)
  sizes = []
  for n in (8, 32):
    fn, params = _model(graph)
    batch = M.make_batch(n * 2)
    mesh = jax.make_mesh((2,), ("pipe",))
    step = tj.schedule(fn, mesh=mesh, placement=graph, num_microbatches=n,
                       interpret_ramps=8)  # the loop lowering
    text = step.lower(params, batch).as_text()
    sizes.append(len(text))
    loops = [s for s in step.built.plan.segments if s.is_loop]
    assert len(loops) == 1
  assert abs(sizes[1] - sizes[0]) / sizes[0] < 0.02


def test_memory_limit_switches_blocks_to_recompute():
  graph = tj.placements.vshape(4)
  fn, params = _model(graph)
  n = 8
  batch = M.make_batch(n * 4)
  mesh = jax.make_mesh((4,), ("pipe",))
  free = tj.schedule(fn, mesh=mesh, placement=graph, num_microbatches=n)
  built = free.build(params, batch)
  assert all(built.kernels.keep.values())
  # parameters, gradients and the hoisted values (the tied head's
  # transposed embedding, passes.hoist) are held against the limit
  fixed = 2 * max(built.layout.bytes_per_device()) + built.report.hoisted_bytes
  assert built.report.hoisted_bytes > 0
  unit = built.memory_unit
  tight = tj.schedule(fn, mesh=mesh, placement=graph, num_microbatches=n,
                      memory_limit=fixed + 4 * unit)
  loss, grads = tight(params, batch)
  assert not all(tight.built.kernels.keep.values())
  ref_loss, ref_grads = M.reference(fn, params, batch, n)
  assert M.max_rel_err(grads, ref_grads) <= TOL
  too_tight = tj.schedule(fn, mesh=mesh, placement=graph, num_microbatches=n,
                          memory_limit=fixed)
  with pytest.raises(tj.TesselError, match="no schedule fits the memory"
                     " limit"):
    too_tight(params, batch)


@pytest.mark.parametrize("ramps", [None, 1], ids=["unrolled", "interpreted"])
def test_ramps_unrolled_or_interpreted(ramps):
  step = _check_train(tj.placements.vshape(4), n=8, interpret_ramps=ramps)
  kinds = {s.kind for s in step.built.plan.segments}
  assert ("interp" in kinds) == (ramps is not None)
