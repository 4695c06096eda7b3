"""Classic schedules priced as they are lowered (``step.replay_run``,
``CostModel.replay_like``): their own tick plan, per-tick costs and
rendezvous, plus the per-tick seconds the searched plan's stand-in
measured, instead of block times alone (which priced README GPT's four
interleaved plans within 4% of each other for 30.4-35.4 ms measured)."""

from __future__ import annotations

import dataclasses

import jax
import pytest

import tessel_jax as tj
from tessel_jax import placements
from tessel_jax import plans as P
from tessel_jax.cost import ticks
from tessel_jax.search import baselines

from test_cost import _tiny


# Builds here price ticks with the microbenchmark's figures, not test them:
# measured once per worker and mesh (conftest.shared_tick_costs).
pytestmark = pytest.mark.usefixtures("shared_tick_costs")


def test_classic_schedules_pay_for_their_own_ticks(tmp_path):
  fn, params, batch = _tiny(n=4, kinds=("embed", "layer", "layer", "head"))
  step = tj.schedule(fn, mesh=jax.make_mesh((2,), ("pipe",)),
                     placement=placements.interleaved(2), num_microbatches=4,
                     cost="measured", cache_dir=str(tmp_path))
  built = step.build(params, batch)
  rep = built.report
  serial_ms = (rep.fsdp_collective_ms or 0.0) + (rep.outside_ms or 0.0)
  rr = step.replay_run
  # The searched plan replayed as lowered is its own prediction.
  assert 1e3 * rr(built.unrolled, built.plan) == pytest.approx(
      rep.predicted_step_ms - serial_ms, rel=1e-6)
  # A second per kernel call, far above any tick's own measured cost: the
  # classic schedule's replay grows by a whole number of seconds, at least
  # the calls of its own busiest device (they run one after another) and at
  # most its own ticks (quiet runs add exactly its 29 ticks; two suite
  # runs added 22: what the measured profile says of the CPU, e.g. cores
  # shared by the devices, changes how the replay lets devices run ahead of
  # each other; not pinned down).
  more = dataclasses.replace(rr, extra_s=1.0)
  for name in ("gpipe", "1f1b"):
    run = baselines.run(name, built.graph, 4)
    plan = rr.make_plan(run.actions)
    calls = ticks.kernel_calls(plan).values()
    busiest = max(sum(c[d] for c in calls) for d in range(2))
    added = more(run, plan) - rr(run, plan)
    assert added == pytest.approx(round(added), abs=1e-3)
    assert busiest <= round(added) <= len(plan.ticks), (busiest, added)
    # The classic schedule's price scales the searched plan's prediction
    # by the two replays as lowered.
    c = P.Candidate("interleaved", 2, 1, 4, name)
    base = P.PricedPlan(candidate=P.Candidate("interleaved", 2, 1, 4),
                        step=rep.predicted_step_ms, unit="ms",
                        peak_bytes_per_device=rep.peak_memory_bytes,
                        source="tessel", blocks=4, build_seconds=0.0)
    got = P.baseline_price(built, c, base, rr)
    assert got.step - serial_ms == pytest.approx(
        (rep.predicted_step_ms - serial_ms) * rr(run, plan) /
        rr(built.unrolled, built.plan), rel=1e-6)
    if name == "gpipe":
      # GPipe holds every micro-batch: with the stash term it also pays
      # for the bytes it holds beyond the searched plan's, every step.
      per = 1e-9
      priced = P.baseline_price(built, c, base, rr, stash_s_per_byte=per)
      delta = max(got.peak_bytes_per_device) - max(rep.peak_memory_bytes)
      assert delta > 0
      shared = rr.costs.shared_cores
      assert priced.step - got.step == pytest.approx(
          1e3 * delta * per * (2 / shared if shared else 1), rel=1e-9)
