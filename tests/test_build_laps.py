"""A measured build's progress lines say where its time goes: the second
search (on uniform spans) and the pricing that picks between the two
schedules (which measures the per-tick and packing costs) each get a line."""

from __future__ import annotations

import logging

import jax
import pytest

import tessel_jax as tj
from experiments import train_cold_lib
from tessel_jax import placements

import test_lowering_models as M


# Builds here price ticks with the microbenchmark's figures, not test them:
# measured once per worker and mesh (conftest.shared_tick_costs).
pytestmark = pytest.mark.usefixtures("shared_tick_costs")


def test_measured_build_laps_search_on_uniform_spans_then_price(
    tmp_path, caplog):
  kinds = ["embed", "head"]
  step = tj.schedule(M.chain_fn(kinds), mesh=jax.make_mesh((2,), ("pipe",)),
                     placement=placements.vshape(2), num_microbatches=4,
                     cost="measured", cache_dir=str(tmp_path),
                     solver_time_limit_s=10)
  with caplog.at_level(logging.INFO, logger="tessel_jax"):
    step.build(M.make_params(M.num_layers(kinds)), M.make_batch(16))
  phases = [train_cold_lib.mark_of(r.getMessage())
            for r in caplog.records if r.name == "tessel_jax"]
  assert phases.index("search on uniform spans") + 1 == phases.index("price")
  assert phases.index("search") < phases.index("price") < phases.index(
      "lower"), phases
