"""tj.schedule(..., has_aux=True): (loss, aux) as jax.value_and_grad gives it.

Training returns ``((loss, aux), grads)`` with ``loss`` and ``grads`` the
mean over micro-batches and every aux leaf stacked per micro-batch; the
reference is ``jax.value_and_grad(fn, has_aux=True)`` applied to each
micro-batch. Inference returns ``(outputs, aux)`` with aux stacked the same
way.
"""

from __future__ import annotations

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import tessel_jax as tj
from tessel_jax.api import TesselError

import test_lowering_models as M

try:
  from tessel_jax.passes import partition as P  # type: ignore
  from tessel_jax.passes import shared_aux as SA  # type: ignore
  from tessel_jax.passes import tracing as T  # type: ignore
except ImportError:
  from passes import partition as P  # type: ignore
  from passes import shared_aux as SA  # type: ignore
  from passes import tracing as T  # type: ignore

TOL = 1e-5


def aux_chain_fn(num_blocks: int, stat: str = "mean"):
  """Embedding (block 0, with a batch statistic), layers, tied head.

  aux: ``acc`` (float accuracy of the micro-batch), ``nll_row`` (per-row
  loss, shape ``(b,)``), ``emb_stat`` (a statistic over the batch of the
  embedding, computed in block 0: ``"mean"``, ``"max"``, ``"sum"`` or
  ``"count"``),
  ``emb_row`` (per-row, block 0), ``correct`` (an int32 count, last block).
  """

  def fn(params, batch):
    h = M.embed(params, batch["tokens"])
    if stat == "mean":
      emb = h.mean(axis=(0, 1))
    elif stat == "max":
      emb = h.max(axis=(0, 1))
    elif stat == "sum":
      emb = h.sum(axis=(0, 1))
    else:
      emb = jnp.sum(h > 0, axis=(0, 1)).astype(jnp.int32)
    emb_row = h.mean(axis=(1, 2))
    h = tj.boundary(h)
    for i in range(num_blocks - 1):
      h = M.layer(params["layers"][i], h)
      if i < num_blocks - 2:
        h = tj.boundary(h)
    logits = h @ params["wte"].T
    logp = jax.nn.log_softmax(logits, axis=-1)
    nll = -jnp.take_along_axis(logp, batch["labels"][..., None], -1)[..., 0]
    hit = jnp.argmax(logits, -1) == batch["labels"]
    aux = {"acc": hit.mean(), "nll_row": nll.mean(axis=1), "emb_stat": emb,
           "emb_row": emb_row, "correct": jnp.sum(hit).astype(jnp.int32)}
    return nll.mean(), aux

  return fn


def reference(fn, params, batch, n):
  """Per micro-batch ``value_and_grad(has_aux=True)``; loss and gradients
  averaged, aux stacked."""
  mbs = jax.tree_util.tree_map(lambda x: x.reshape((n, -1) + x.shape[1:]),
                               batch)
  (loss, aux), grads = jax.vmap(jax.value_and_grad(fn, has_aux=True),
                                (None, 0))(params, mbs)
  return (loss.mean(), aux), jax.tree_util.tree_map(lambda g: g.mean(0),
                                                    grads)


def _assert_aux_equal(got, want):
  assert jax.tree_util.tree_structure(got) == jax.tree_util.tree_structure(
      want)
  for a, b in zip(jax.tree_util.tree_leaves(got),
                  jax.tree_util.tree_leaves(want)):
    assert a.shape == b.shape and a.dtype == b.dtype
    if jnp.issubdtype(b.dtype, jnp.integer):
      np.testing.assert_array_equal(a, b)
    else:
      assert M.max_rel_err(a, b) <= TOL


def _mesh(*shape_names):
  shape = tuple(s for s, _ in shape_names)
  return jax.make_mesh(shape, tuple(n for _, n in shape_names))


@pytest.mark.parametrize("graph", [tj.placements.vshape(4),
                                   tj.placements.mshape(4)],
                         ids=lambda g: g.name)
def test_train_matches_value_and_grad_with_aux(graph):
  n_fwd = sum(1 for b in graph.blocks if b.kind == "F")
  fn = aux_chain_fn(n_fwd)
  params, batch, n = M.make_params(n_fwd - 1), M.make_batch(4 * 4), 4
  step = tj.schedule(fn, mesh=_mesh((4, "pipe")), placement=graph,
                     num_microbatches=n, has_aux=True)
  (loss, aux), grads = step(params, batch)
  (ref_loss, ref_aux), ref_grads = reference(fn, params, batch, n)
  assert M.max_rel_err(loss, ref_loss) <= TOL
  assert M.max_rel_err(grads, ref_grads) <= TOL
  _assert_aux_equal(aux, ref_aux)
  assert aux["nll_row"].shape == (n, 4) and aux["acc"].shape == (n,)


def test_aux_from_a_block_is_its_own_terminal():
  """emb_stat (block 0) is read straight from block 0, not passed down."""
  fn = aux_chain_fn(4)
  params, batch = M.make_params(3), M.make_batch(4)
  traced = T.trace(fn, "fn", params, batch, has_aux=True)
  part = P.partition(traced)
  assert traced.num_aux == 5 and part.primary_outputs == (0,)
  sources = {part.epilogue.terminals[j].index for j in part.aux_terminals}
  assert sources == {0, 3}
  assert len(part.blocks[0].outvars) == 3       # h, statistic, per-row
  assert all(len(b.outvars) == 1 for b in part.blocks[1:3])


def test_aux_passes_inputs_and_constants_through():
  """Aux leaves that are a parameter, a batch leaf or a constant."""
  base = aux_chain_fn(4)

  def fn(params, batch):
    loss, aux = base(params, batch)
    return loss, {"acc": aux["acc"], "gate": params["gate"],
                  "labels": batch["labels"], "one": jnp.float32(1.0),
                  "stat": aux["emb_stat"]}

  params, batch, n = M.make_params(3), M.make_batch(4 * 4), 4
  step = tj.schedule(fn, mesh=_mesh((4, "pipe")),
                     placement=tj.placements.vshape(4), num_microbatches=n,
                     has_aux=True)
  (loss, aux), grads = step(params, batch)
  (ref_loss, ref_aux), ref_grads = reference(fn, params, batch, n)
  assert M.max_rel_err(loss, ref_loss) <= TOL
  assert M.max_rel_err(grads, ref_grads) <= TOL
  _assert_aux_equal(aux, ref_aux)
  assert aux["labels"].shape == (n, 4, M.SEQ) and aux["one"].shape == (n,)


def test_many_microbatches_loop_and_ramps():
  """N = 16: the steady state runs as a loop and the ramps as interpreted
  segments; aux buffers are indexed per micro-batch in both."""
  fn = aux_chain_fn(4)
  params, batch, n = M.make_params(3), M.make_batch(16 * 2), 16
  step = tj.schedule(fn, mesh=_mesh((4, "pipe")),
                     placement=tj.placements.vshape(4), num_microbatches=n,
                     has_aux=True, interpret_ramps=2)
  (loss, aux), grads = step(params, batch)
  kinds = {seg.kind for seg in step.built.plan.segments}
  assert {"loop", "interp"} <= kinds, kinds
  (ref_loss, ref_aux), ref_grads = reference(fn, params, batch, n)
  assert M.max_rel_err(loss, ref_loss) <= TOL
  assert M.max_rel_err(grads, ref_grads) <= TOL
  _assert_aux_equal(aux, ref_aux)


def test_infer_returns_outputs_and_stacked_aux():
  fn = aux_chain_fn(5)
  params, batch, n = M.make_params(4), M.make_batch(4 * 4), 4
  step = tj.schedule(fn, mesh=_mesh((4, "pipe")),
                     placement=tj.placements.mshape(4), num_microbatches=n,
                     mode="infer", has_aux=True)
  losses, aux = step(params, batch)
  (_, ref_aux), _ = reference(fn, params, batch, n)
  mbs = jax.tree_util.tree_map(lambda x: x.reshape((n, -1) + x.shape[1:]),
                               batch)
  ref_losses = jax.vmap(lambda b: fn(params, b)[0])(mbs)
  assert losses.shape == (n,)
  assert M.max_rel_err(losses, ref_losses) <= TOL
  _assert_aux_equal(aux, ref_aux)


def test_data_parallel_replicas_stack_in_order():
  fn = aux_chain_fn(4)
  params, batch, n = M.make_params(3), M.make_batch(8 * 2), 8
  step = tj.schedule(fn, mesh=_mesh((2, "data"), (4, "pipe")),
                     placement=tj.placements.vshape(4), num_microbatches=n,
                     has_aux=True)
  (loss, aux), grads = step(params, batch)
  (ref_loss, ref_aux), ref_grads = reference(fn, params, batch, n)
  assert M.max_rel_err(loss, ref_loss) <= TOL
  assert M.max_rel_err(grads, ref_grads) <= TOL
  _assert_aux_equal(aux, ref_aux)
  assert aux["nll_row"].shape == (n, 2)


def test_non_affine_aux_in_the_epilogue_of_two_towers():
  """X-shape: the towers meet only in the outputs; the loss is an affine mix
  of their losses, the aux their product and a comparison (neither is)."""

  def tower(params, batch, first, last):
    h = tj.boundary(M.embed(params, batch["tokens"]))    # 4 blocks a tower
    for i in range(first, first + 3):
      h = M.layer(params["layers"][i], h)
      h = tj.boundary(h) if i < first + 2 else h
    loss = M.head_loss(params, h, batch["labels"])
    return loss if last else tj.boundary(loss)

  def fn(params, batch):
    la = tower(params, batch, 0, False)
    lb = tower(params, batch, 3, True)
    return la + 0.5 * lb, {"prod": la * lb, "a_wins": la < lb}

  params, batch, n = M.make_params(6), M.make_batch(4 * 4), 4
  step = tj.schedule(fn, mesh=_mesh((4, "pipe")),
                     placement=tj.placements.xshape(4), num_microbatches=n,
                     has_aux=True)
  (loss, aux), grads = step(params, batch)
  (ref_loss, ref_aux), ref_grads = reference(fn, params, batch, n)
  assert M.max_rel_err(loss, ref_loss) <= TOL
  assert M.max_rel_err(grads, ref_grads) <= TOL
  assert aux["a_wins"].dtype == jnp.bool_
  np.testing.assert_array_equal(aux["a_wins"], ref_aux["a_wins"])
  assert M.max_rel_err(aux["prod"], ref_aux["prod"]) <= TOL


# --- errors -------------------------------------------------------------------


def _schedule(fn, graph=None, mode="train", rows=4, n=4):
  graph = graph or tj.placements.vshape(4)
  n_fwd = sum(1 for b in graph.blocks if b.kind == "F")
  step = tj.schedule(fn, mesh=_mesh((graph.num_devices, "pipe")),
                     placement=graph, num_microbatches=n, mode=mode,
                     has_aux=True)
  return step(M.make_params(max(n_fwd - 1, 1)), M.make_batch(rows * n))


def test_has_aux_needs_a_pair():
  loss_only = lambda p, b: aux_chain_fn(4)(p, b)[0]
  with pytest.raises(TesselError, match=r"has_aux=True needs fn to return a"
                     r" pair \(loss, aux\).*returned one array of shape \(\)"):
    _schedule(loss_only)
  as_list = lambda p, b: list(aux_chain_fn(4)(p, b))
  with pytest.raises(TesselError, match="returned a list of length 2"):
    _schedule(as_list)


def test_aux_leaves_must_be_arrays():
  def fn(p, b):
    loss, aux = aux_chain_fn(4)(p, b)
    return loss, {**aux, "note": "epoch 1"}
  with pytest.raises(TesselError, match=r"aux must be a pytree of arrays, but"
                     r" its leaf \['note'\] is a str"):
    _schedule(fn)


def test_train_needs_a_scalar_loss():
  def fn(p, b):
    loss, aux = aux_chain_fn(4)(p, b)
    return aux["nll_row"], aux
  with pytest.raises(TesselError, match=r"has_aux=True needs fn to return"
                     r" \(loss, aux\) with a scalar float loss; its loss is"
                     r" \['\(4,\):float32'\]"):
    _schedule(fn)


def test_without_has_aux_a_pair_gets_a_hint():
  step = tj.schedule(aux_chain_fn(4), mesh=_mesh((4, "pipe")),
                     placement=tj.placements.vshape(4), num_microbatches=2)
  with pytest.raises(TesselError, match="pass has_aux=True"):
    step(M.make_params(3), M.make_batch(8))


@pytest.mark.parametrize("stat,problem", [
    ("max", "is not the mean over the rows"),
    ("sum", "is not the mean over the rows"),
    ("count", "is of type int32"),
])
def test_shared_block_aux_is_exact_or_refused_by_name(stat, problem):
  """mshape's block 0 is shared by 4 devices. A batch mean there comes back
  exactly (tests above). A max, sum or count over the rows is exact where
  the block runs replicated (every device on all rows); where it splits the
  rows it is refused by name, never silently different."""
  fn = aux_chain_fn(5, stat)
  params, batch, n = M.make_params(4), M.make_batch(4 * 4), 4
  step = tj.schedule(fn, mesh=_mesh((4, "pipe")),
                     placement=tj.placements.mshape(4), num_microbatches=n,
                     has_aux=True)
  try:
    (loss, aux), grads = step(params, batch)
  except TesselError as err:
    assert re.search(
        r"the aux leaf aux\['emb_stat'\] is computed in block 0, which runs"
        r" on 4 devices \[0, 1, 2, 3\].*" + problem +
        r".*place block 0 on one device", str(err)), str(err)
    return
  (ref_loss, ref_aux), ref_grads = reference(fn, params, batch, n)
  assert M.max_rel_err(loss, ref_loss) <= TOL
  assert M.max_rel_err(grads, ref_grads) <= TOL
  _assert_aux_equal(aux, ref_aux)


def _stat_problem(stat):
  """``shared_aux``'s verdict on block 0's ``emb_stat`` split 4 ways."""
  fn = aux_chain_fn(5, stat)
  params = M.make_params(4)
  full = P.partition(T.trace(fn, "fn", params, M.make_batch(4), has_aux=True))
  local = P.partition(T.trace(fn, "fn", params, M.make_batch(1),
                              has_aux=True))
  pos = {v: k for k, v in SA._aux_names(full).items()}["aux['emb_stat']"]
  term = full.epilogue.terminals[
      full.epilogue.invars.index(full.epilogue.outvars[pos])]
  assert term.index == 0
  return SA._problem(full.blocks[0], local.blocks[0], term.output, 4, 4)


def test_row_split_check_tells_a_row_mean_from_other_statistics():
  """The numerical check itself: the mean of the 4 devices' values equals
  the full block's only for a float mean over the rows."""
  assert _stat_problem("mean") is None
  assert "not the mean over the rows" in _stat_problem("max")
  assert "not the mean over the rows" in _stat_problem("sum")
  assert "is of type int32" in _stat_problem("count")


def test_has_aux_must_be_a_bool():
  with pytest.raises(TesselError, match="has_aux must be True or False"):
    tj.schedule(aux_chain_fn(4), mesh=_mesh((4, "pipe")),
                placement=tj.placements.vshape(4), num_microbatches=2,
                has_aux="yes")
