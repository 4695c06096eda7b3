"""experiments.model_zoo_spans: forcing a candidate, judging the choice."""

from __future__ import annotations

import jax
import numpy as np

import tessel_jax as tj
from experiments import model_zoo_spans_lib as lib
from tessel_jax import schedule_choice


def _fn(params, batch):
  h = jax.numpy.tanh(batch["x"] @ params["w0"])
  h = tj.boundary(h)
  return jax.numpy.mean(jax.numpy.tanh(h @ params["w1"]) ** 2)


def test_forced_lowers_each_candidate_and_restores_the_choice():
  k = jax.random.split(jax.random.key(0), 3)
  params = {"w0": jax.random.normal(k[0], (16, 16)) * 0.3,
            "w1": jax.random.normal(k[1], (16, 16)) * 0.3}
  batch = {"x": jax.random.normal(k[2], (16, 16))}
  mesh = jax.sharding.Mesh(np.array(jax.devices()[:2]), ("pipe",))
  orig = schedule_choice.choose
  got = {}
  for which in lib.CANDIDATES:
    choices: list[str] = []
    with lib.forced(which, choices):
      step = tj.schedule(_fn, mesh=mesh, placement=tj.placements.vshape(2),
                         num_microbatches=4, cost="measured")
      built = step.build(params, batch)
    assert choices and choices[0] in lib.CANDIDATES
    got[which] = built.report.schedule_costs
    want = jax.value_and_grad(_fn)(params, batch)
    loss, _ = built.jitted(params, batch)
    np.testing.assert_allclose(loss, want[0], rtol=1e-5)
  # "measured" is the schedule searched on the measured spans, on the
  # automatic grid or on the coarser one (Switches.coarse_grid), whichever
  # the build priced faster.
  assert got["measured"] in ("measured", "coarse"), got
  assert got["uniform"] == "uniform", got
  assert schedule_choice.choose is orig


def test_judge_and_markdown():
  row = {"model": "m", "choice": "uniform",
         "measured": {"predicted_ms": 10.0, "measured_ms": 9.0},
         "uniform": {"predicted_ms": 12.0, "measured_ms": 12.0}}
  row = lib.judge(row)
  assert row["faster_measured"] == "measured" and not row["choice_right"]
  assert row["uniform"]["measured_over_predicted"] == 1.0
  table = lib.markdown([row])
  assert "| m | uniform | 10.0 / 9.0" in table and "| False | 1.0 |" in table
  close = lib.judge({"model": "m", "choice": "uniform",
                     "measured": {"predicted_ms": 10.0, "measured_ms": 9.8},
                     "uniform": {"predicted_ms": 12.0, "measured_ms": 10.0}})
  assert close["choice_right"]    # within 5%: either is right


def test_the_price_after_the_rounds_brackets_them():
  row = lib.judge({"model": "m", "choice": "measured",
                   "measured": {"predicted_ms": 10.0, "measured_ms": 12.0,
                                "predicted_after_ms": 14.4,
                                "same_plan_after": True},
                   "uniform": {"predicted_ms": 12.0, "measured_ms": 13.0}})
  got = row["measured"]
  assert got["measured_over_predicted"] == 1.2
  assert got["drift"] == 1.44
  assert got["measured_over_bracket"] == 1.0     # 12 / sqrt(10 * 14.4)
  assert "drift" not in row["uniform"]
  assert "| 1.2 | 1.44 | 1.0 |" in lib.markdown([row])
  row["measured"]["same_plan_after"] = False
  assert "1.44 (another plan)" in lib.markdown([row])
