"""Classic schedules by name on any placement they mean something for.

``plan="1f1b"`` runs 1F1B over the stage list of any training placement
(forward blocks in topological order; a shared block is a stage on every
device it occupies); ``plan="gpipe"`` fits
every placement; aliases ``interleaved`` and ``zb``. Every baseline passes
the independent validator, and the lowered program equals
``jax.value_and_grad``.
"""

from __future__ import annotations

import jax
import pytest

import tessel_jax as tj
from tessel_jax import placements, validate
from tessel_jax.search import baselines

import test_lowering_models as M

NAMES = ("vshape", "xshape", "mshape", "kshape", "nnshape", "nnshape_eager",
         "mllm", "finetune", "alphafold", "zbv", "interleaved")


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("d", (2, 4, 8))
def test_every_fitting_baseline_validates(name, d):
  graph = placements.get(name, d)
  fitting = baselines.for_placement(graph)
  assert fitting[:2] == ["gpipe", "1f1b"]   # on every training placement
  for plan in fitting:
    for n in (1, 3, 8):
      if plan == "dualpipev" and n < 2 * d:   # DualPipeV needs N >= 2D
        with pytest.raises(ValueError, match=f"{2 * d} micro-batches"):
          baselines.run(plan, graph, n)
        continue
      run = baselines.run(plan, graph, n)
      validate.assert_valid(run)
      assert run.source == plan


def test_1f1b_on_mshape_holds_less_than_gpipe():
  graph = placements.mshape(4)
  one = baselines.run("1f1b", graph, 16)
  gp = baselines.run("gpipe", graph, 16)
  assert max(one.peak_memory) < max(gp.peak_memory)
  # The shared first block is a stage on every device: the last device
  # holds at most one micro-batch of its own stage plus the shared stage's.
  assert one.peak_memory[3] < gp.peak_memory[3]


def test_1f1b_on_vshape_is_the_classic_schedule():
  graph = placements.vshape(4, f_span=1, b_span=3)
  assert baselines.run("1f1b", graph, 8).makespan == (8 + 4 - 1) * 4


def test_aliases():
  assert baselines.run("interleaved", placements.interleaved(4), 8).source == (
      "interleaved_1f1b")
  assert baselines.run("zb", placements.vshape(4, split_backward=True),
                       8).source == "zb_h1"
  assert baselines.run("GPipe", placements.mshape(4), 4).source == "gpipe"


def test_unknown_name_lists_names_and_aliases():
  with pytest.raises(ValueError, match="zb_h1") as info:
    baselines.run("pipedream", placements.vshape(4), 4)
  assert "interleaved (interleaved_1f1b)" in str(info.value)


def test_refused_plan_lists_those_that_fit():
  with pytest.raises(ValueError, match="Baselines that fit it: gpipe, 1f1b"):
    baselines.run("chimera", placements.mshape(4), 4)


@pytest.mark.parametrize("plan", ["1f1b", "gpipe"])
def test_plan_on_mshape_matches_value_and_grad(plan):
  kinds = ["embed", "mixed", "layer", "layer", "head"]
  fn, params = M.chain_fn(kinds), M.make_params(M.num_layers(kinds))
  n = 8
  batch = M.make_batch(n * 4)
  mesh = jax.make_mesh((4,), ("pipe",))
  step = tj.schedule(fn, mesh=mesh, placement=placements.mshape(4),
                     num_microbatches=n, plan=plan)
  loss, grads = step(params, batch)
  ref_loss, ref_grads = M.reference(fn, params, batch, n)
  assert M.max_rel_err(loss, ref_loss) <= 1e-5
  assert M.max_rel_err(grads, ref_grads) <= 1e-5
  assert step.unrolled.source == plan
  validate.assert_valid(step.unrolled)


@pytest.mark.parametrize("name", ["xshape", "kshape"])
def test_1f1b_on_branching_placements_matches_value_and_grad(name):
  graph = placements.get(name, 4)
  if name == "xshape":
    per = sum(1 for b in graph.blocks if b.kind == "F") // 2
    fn, params = M.two_tower_fn(per), M.make_params(2 * (per - 1))
  else:
    fn, params = M.k_fn(2), M.make_params(2 * (2 - 1) + 1)
  n = 4
  batch = M.make_batch(n * 4)
  mesh = jax.make_mesh((4,), ("pipe",))
  step = tj.schedule(fn, mesh=mesh, placement=graph, num_microbatches=n,
                     plan="1f1b")
  loss, grads = step(params, batch)
  ref_loss, ref_grads = M.reference(fn, params, batch, n)
  assert M.max_rel_err(loss, ref_loss) <= 1e-5
  assert M.max_rel_err(grads, ref_grads) <= 1e-5
  assert step.unrolled.source == "1f1b"
