"""``Switches(workspace=True)``: the hoisted values written into a workspace
the placed step keeps and donates to its next call (``tessel_jax.placed``,
``tessel_jax.placed_step``), checked against ``jax.value_and_grad``."""

from __future__ import annotations

import jax
import pytest

import tessel_jax as tj
from tessel_jax import placements
from tessel_jax.passes.switches import Switches

import test_hoist as H
import test_lowering_models as M


def _step(workspace: bool):
  fn, params, batch = H.conv_model()
  mesh = jax.make_mesh((2,), ("pipe",), devices=jax.devices()[:2])
  step = tj.schedule(fn, mesh=mesh, placement=placements.vshape(2),
                     num_microbatches=H.N, cut="markers", cost="uniform",
                     param_layout="auto",
                     switches=Switches(workspace=workspace))
  return fn, params, batch, step


def test_workspace_is_donated_written_in_place_and_matches_value_and_grad():
  fn, params, batch, step = _step(True)
  ref_loss, ref_grads = M.reference(fn, params, batch, H.N)
  placed = step.place(params, batch)
  compiled = step.lower(placed, batch).compile()
  hoisted = step.built.report.hoisted_bytes
  assert hoisted > 0
  # the device's hoisted values alias the donated workspace (per device)
  assert compiled.memory_analysis().alias_size_in_bytes == hoisted
  loss1, grads1 = step(placed, batch)
  kept = jax.tree_util.tree_leaves(_workspace(step))
  loss2, grads2 = step(placed, batch)
  assert kept and all(w.is_deleted() for w in kept)  # donated to call 2
  for loss, grads in ((loss1, grads1), (loss2, grads2)):
    assert M.max_rel_err(loss, ref_loss) <= 1e-5
    assert M.max_rel_err(step.unplace(grads), ref_grads) <= 1e-5
  # the user's gradients stay theirs across calls (not the workspace)
  assert not any(g.is_deleted() for g in jax.tree_util.tree_leaves(grads1))


def _entry(step):
  from tessel_jax import placed_step  # pylint: disable=import-outside-toplevel
  (entry,) = placed_step._state(step).entries.values()  # pylint: disable=protected-access
  return entry


def _workspace(step):
  return _entry(step).workspace


def test_workspace_leaves_the_temp_and_serves_train_step():
  _, params, batch, on = _step(True)
  _, _, _, off = _step(False)
  temps = {}
  for name, step in (("on", on), ("off", off)):
    placed = step.place(params, batch)
    temps[name] = step.lower(placed, batch).compile(
    ).memory_analysis().temp_size_in_bytes
  assert temps["on"] <= temps["off"] - on.built.report.hoisted_bytes, temps
  # train_step's half needs optax (the `models` extra): the temp check
  # above runs without it.
  optax = pytest.importorskip("optax")
  opt = optax.sgd(0.1)
  outs = []
  for step in (on, off):
    placed = step.place(params, batch)
    train = step.train_step(opt)
    state = opt.init(placed)
    for _ in range(2):  # the second call gets the first's workspace
      value, placed, state = train(placed, state, batch)
    outs.append((value, step.unplace(placed)))
  assert M.max_rel_err(outs[0], outs[1]) <= 1e-6
  # the hoisted values' and the gradients' buffers, kept for the next call
  for kept in (_workspace(on), _entry(on).grad_workspace):
    leaves = jax.tree_util.tree_leaves(kept)
    assert leaves and not any(w.is_deleted() for w in leaves)
