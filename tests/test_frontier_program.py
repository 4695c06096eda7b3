"""``experiments.frontier --model=readme_gpt|<zoo model>``: a real program's
frontier (``experiments.frontier_program``)."""

from __future__ import annotations

import os

import pytest

from experiments import frontier_lib, frontier_plot, frontier_program, runs


def _args(tmp_path, **kw):
  base = dict(model="readme_gpt", cost_source="analytic", devices=4,
              placements=("vshape",), microbatches=4, gpt_rows=2,
              memory_limit=None, time_limit=0.5, output_dir=str(tmp_path))
  base.update(kw)
  return frontier_lib.FrontierArgs(**base)


def test_readme_gpt_frontier_json_summary_and_plot(tmp_path):
  lines = []
  results = frontier_lib.run(_args(tmp_path), log=lines.append)
  data = runs.read(results["output"])
  fr = data["program_frontier"]
  plans = fr["plans"]
  labels = [p["label"] for p in plans]
  # Both widths of the 1-D mesh (pipe4 and pipe2 x dp2), searched and
  # classic schedules.
  assert any("pipe4 dp1" in l for l in labels)
  assert any("pipe2 dp2" in l for l in labels)
  assert any(p["candidate"]["plan"] == "1f1b" for p in plans)
  assert data["unit"] == "steps" and all(p["step"] > 0 for p in plans)
  fastest = min(plans, key=lambda p: (p["step"], p["peak_bytes"]))
  assert data["chosen_label"] == fastest["label"]
  for i, p in enumerate(plans):
    beaten = any(q["step"] <= p["step"] and q["peak_bytes"] <= p["peak_bytes"]
                 and (q["step"], q["peak_bytes"]) != (p["step"],
                                                      p["peak_bytes"])
                 for q in plans)
    assert (i in fr["pareto"]) == (not beaten)
  text = frontier_lib.summary(data)
  assert "frontier of readme_gpt" in text and "chosen for no limit" in text
  assert f"{fastest['label']} *" in text
  (path,) = frontier_plot.plot_frontier(data, str(tmp_path / "p"))
  assert os.path.getsize(path) > 1000


def test_zoo_model_with_measured_costs_under_a_limit(tmp_path):
  pytest.importorskip("equinox")
  args = _args(tmp_path, model="eqx_mlp", cost_source="measured", devices=2,
               placements=("vshape",), microbatches=2, gpt_rows=4,
               baselines=False, memory_limit=64 * 2**20,
               cache_dir=str(tmp_path / "cache"))
  results = frontier_lib.run(args, log=lambda _l: None)
  plans = results["program_frontier"]["plans"]
  assert plans and results["unit"] == "ms"
  assert all(p["step"] > 0 and p["peak_bytes"] > 0 for p in plans)
  # Searched with no limit and under the 64 MiB one.
  assert {p["candidate"]["memory_limit"] for p in plans} == {None, 64 * 2**20}
  assert results["chosen_label"] is not None


def test_program_names_and_errors():
  assert frontier_program.programs()[0] == "readme_gpt"
  assert "eqx_mlp" in frontier_program.programs()
  frontier_lib.check_args(frontier_lib.FrontierArgs(model="readme_gpt"))
  with pytest.raises(ValueError, match="analytic preset.*readme_gpt"):
    frontier_lib.check_args(frontier_lib.FrontierArgs(model="gpt9"))
  with pytest.raises(ValueError, match="model 'gpt9'"):
    frontier_program.load("gpt9", 4)
