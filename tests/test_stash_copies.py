"""The stash is never copied whole inside a loop.

Within one loop iteration a tick reads the stash (inside its switch) and a
later tick writes into it values that do not depend on that read. XLA
orders in-place writes only after the reads they depend on, so unless the
lowering ties the writes to the earlier reads (``passes.stash_order``) it
copies the whole stash twice per iteration (measured 2026-11-25: two 12 MiB
copies per period of the 2-stage MLP of ``experiments.peer_bench``). Counts
stash-shaped copies in the compiled HLO of small 2-stage pipelines and
checks the numbers against ``jax.value_and_grad``.
"""

from __future__ import annotations

import jax
import pytest

import tessel_jax as tj
from experiments import hlo_count, lowering_bench_lib, peer_bench_lib, peer_gpipe
from tessel_jax import placements

import test_lowering_models as M

HIDDEN = 24
ROWS = 8
N = 6


@pytest.mark.parametrize("plan", [None, "1f1b"])
def test_loops_do_not_copy_the_stash(plan):
  fn, params = lowering_bench_lib.chain_model(2, HIDDEN, 2)
  batch = lowering_bench_lib.make_batch(N * ROWS, HIDDEN)
  mesh = jax.make_mesh((2,), ("pipe",), devices=jax.devices()[:2])
  step = tj.schedule(fn, mesh=mesh, placement=placements.vshape(2),
                     num_microbatches=N, plan=plan, cut="markers",
                     interpret_ramps=8)  # the loop lowering
  loss, grads = step(params, batch)
  ref_loss, ref_grads = M.reference(fn, params, batch, N)
  assert M.max_rel_err(loss, ref_loss) <= 1e-5
  assert M.max_rel_err(grads, ref_grads) <= 1e-5
  plan_ = step.built.plan
  assert any(s.is_loop for s in plan_.segments), plan_.loop_summary()
  shapes = [(p.slots + 1,) + tuple(p.aval.shape) for p in plan_.pools]
  ops = hlo_count.param_ops(step.lower(params, batch).compile().as_text(),
                            shapes)
  assert ops["loop"]["copy"] == 0, (plan_.loop_summary(), ops)
  assert ops["loop_branches"]["copy"] == 0, (plan_.loop_summary(), ops)


def test_unrolled_ticks_do_not_copy_the_stash():
  """mshape(4): an all-device kernel runs without a switch in unrolled
  ticks, and unrolled ticks follow a loop. With the unrolled ticks'
  writes unordered (``Switches(straight_order=False)``, as before
  2026-11-26) XLA copies a whole pool 7 times per step here (checked
  2026-11-26: ``16 + loop(3x5) + 13``, 7 copies; ordered: none)."""
  params = peer_gpipe.mlp_params(6, HIDDEN, 0)
  batch = lowering_bench_lib.make_batch(8 * ROWS, HIDDEN)
  mesh = jax.make_mesh((4,), ("pipe",), devices=jax.devices()[:4])
  fn = peer_bench_lib.marked_loss([2, 1, 1, 1, 1])
  step = tj.schedule(fn, mesh=mesh, placement=placements.mshape(4),
                     num_microbatches=8, cut="markers", cost="uniform",
                     interpret_ramps=None)  # loops and unrolled ticks only
  loss, grads = step(params, batch)
  text = step.lower(params, batch).compile().as_text()
  ref_loss, ref_grads = M.reference(fn, params, batch, 8)
  assert M.max_rel_err(loss, ref_loss) <= 1e-5
  assert M.max_rel_err(grads, ref_grads) <= 1e-5
  plan_ = step.built.plan
  shapes = [(p.slots + 1,) + tuple(p.aval.shape) for p in plan_.pools]
  ops = hlo_count.param_ops(text, shapes)
  assert any(s.is_loop for s in plan_.segments), plan_.loop_summary()
  assert sum(ops[k]["copy"] for k in ops) == 0, (plan_.loop_summary(), ops)
