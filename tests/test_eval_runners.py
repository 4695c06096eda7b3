"""The evaluation runners on tiny sweeps: search_scaling, compare_schedules
and the separate plotting step (no flags involved, except one binary run)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from experiments import (compare_schedules_lib, plot_results_lib, runs,
                         search_scaling_lib)
from experiments.compare_schedules_lib import CompareArgs
from experiments.search_scaling_lib import ScalingArgs
from tessel_jax import placements, validate
from tessel_jax.graph import BlockGraph
from tessel_jax.schedule import UnrolledSchedule


def _tiny_scaling(tmp_path, **kw) -> ScalingArgs:
  base = dict(placements=("vshape", "mshape"), devices=(4,),
              memories=("tight", "loose"), memory_devices=(4,),
              microbatches=(4, 16), microbatch_devices=(4,),
              time_limits=(0.2,), time_limit_devices=(4,), time_limit=2.0,
              memory_time_limit=5.0, output_dir=str(tmp_path / "scaling"))
  base.update(kw)
  return ScalingArgs(**base)


@pytest.fixture(scope="module")
def tiny_sweep(tmp_path_factory):
  """The tiny sweep, run once for the tests that read it."""
  args = _tiny_scaling(tmp_path_factory.mktemp("sweep"))
  return args, search_scaling_lib.run(args, log=lambda *_: None)


def test_search_scaling_writes_hash_named_json_with_every_part(tiny_sweep):
  args, results = tiny_sweep
  path = os.path.join(args.output_dir, f"run_{runs.args_hash(args)}.json")
  assert results["output"] == path and os.path.exists(path)
  data = json.loads(open(path).read())
  assert data["runner"] == "search_scaling"
  assert data["wall_seconds"] > 0 and data["environment"]["date"]
  cases = data["cases"]
  assert {c["part"] for c in cases} == set(search_scaling_lib.PARTS)
  # 2 placements x 2 wraps x (1 device count + 2 memories + 1 + 1 limit).
  assert len(cases) == 2 * 2 * 5
  for c in cases:
    assert "error" not in c, c
    assert c["period"] >= c["period_lower_bound"] >= 1
    assert c["gap"] == pytest.approx(
        (c["period"] - c["period_lower_bound"]) / c["period"], abs=1e-4)
    assert c["status"] in ("OPTIMAL", "FEASIBLE")
    assert c["search_seconds"] >= 0 and c["period_seconds"] >= 0
  tight = [c for c in cases if c["memory_case"] == "tight"]
  assert tight and all(c["memory_limit"] >= 1 for c in tight)
  assert {c["allow_wrap"] for c in cases} == {True, False}
  unrolled = [u for c in cases if c["part"] == "microbatches"
              for u in c["unroll"]]
  assert {u["num_microbatches"] for u in unrolled} == {4, 16}
  for u in unrolled:
    assert u["makespan"] >= u["makespan_lower_bound"]
    assert u["unroll_seconds"] >= 0 and "uses_templates" in u
  assert "search_scaling:" in search_scaling_lib.summary(results)


def test_search_scaling_hash_ignores_output_dir_and_tracks_args(tmp_path):
  a = _tiny_scaling(tmp_path)
  assert runs.args_hash(a) == runs.args_hash(a._replace(output_dir="x"))
  assert runs.args_hash(a) != runs.args_hash(a._replace(time_limit=3.0))
  with pytest.raises(ValueError, match="parts"):
    search_scaling_lib.run(a._replace(parts=("nope",)))
  with pytest.raises(ValueError, match="unknown placements"):
    search_scaling_lib.run(a._replace(placements=("nope",)))


def test_search_scaling_records_skips_and_errors_and_goes_on(tmp_path):
  # kshape needs an even device count: d=3 is skipped, d=2 runs. A search
  # that fails is an error row (here: an impossible memory case).
  args = _tiny_scaling(tmp_path, parts=("devices",), placements=("kshape",),
                       devices=(3, 2), wraps=(True,))
  results = search_scaling_lib.run(args, log=lambda *_: None)
  assert [s["devices"] for s in results["skipped"]] == [3]
  assert [c["devices"] for c in results["cases"]] == [2]
  sweep = search_scaling_lib._Sweep(args, log=lambda *_: None)
  graph = placements.get("vshape", 2)
  _, figures = sweep.search(graph, 0, True, 1.0, False)
  assert figures["error"].startswith("InfeasibleScheduleError")


def test_plot_results_draws_search_scaling(tiny_sweep, tmp_path):
  _, results = tiny_sweep
  written = plot_results_lib.run(plot_results_lib.PlotArgs(
      inputs=(results["output"],), output_dir=str(tmp_path / "png")))
  names = sorted(os.path.basename(p) for p in written)
  stem = os.path.splitext(os.path.basename(results["output"]))[0]
  assert names == sorted(f"{stem}_{part}.png"
                         for part in search_scaling_lib.PARTS)
  assert all(os.path.getsize(p) > 1000 for p in written)


def test_compare_schedules_simulates_and_lowers_one_placement(tmp_path):
  args = CompareArgs(placements=("vshape",), devices=2, microbatches=4,
                     memories=("loose", "baseline"), time_limit=5.0,
                     hidden=8, rows=2, repeats=2,
                     output_dir=str(tmp_path / "compare"))
  results = compare_schedules_lib.run(args, log=lambda *_: None)
  assert os.path.basename(results["output"]) == (
      f"run_{runs.args_hash(args)}.json")
  data = json.loads(open(results["output"]).read())
  assert data["runner"] == "compare_schedules"
  (row,) = data["placements"]
  graph = BlockGraph.from_dict(row["graph"])
  assert set(row["schedules"]) == {"tessel", "tessel@baseline", "gpipe",
                                   "1f1b"}
  for label, entry in row["schedules"].items():
    assert "error" not in entry, (label, entry)
    assert entry["makespan"] >= entry["makespan_lower_bound"]
    assert 0 <= entry["bubble_ratio"] < 1
    validate.assert_valid(UnrolledSchedule.from_dict(entry["schedule"], graph))
  assert row["schedules"]["tessel@baseline"]["memory_limit"] == (
      row["schedules"]["1f1b"]["max_peak_memory"])
  assert row["speedups"]["tessel"]["best_baseline"] in ("gpipe", "1f1b")
  assert set(row["lowered"]) == {"tessel", "gpipe", "1f1b"}
  for label, low in row["lowered"].items():
    assert "error" not in low, (label, low)
    assert low["step_seconds"] > 0 and len(low["step_seconds_all"]) == 2
    assert low["check_grad_rel_err"] <= 1e-5
    assert low["check_loss_rel_err"] <= 1e-5
  written = plot_results_lib.plot_file(results["output"])
  names = {os.path.basename(p).split("_", 2)[-1] for p in written}
  assert names == {"gantt_vshape.png", "makespan.png", "step_time.png"}


@pytest.mark.parametrize("name", ["xshape", "kshape", "finetune",
                                  "vshape_split"])
def test_dag_model_fits_each_placement_and_zb_h1_applies(name):
  graph = compare_schedules_lib.build_graph(name, 4)
  fn, params = compare_schedules_lib.dag_model(graph, hidden=4)
  assert len(params) == sum(1 for b in graph.blocks if b.kind == "F")
  if name == "vshape_split":
    args = CompareArgs(microbatches=4, memories=("loose",), time_limit=5.0,
                       lower=False)
    entries = compare_schedules_lib.simulate_all(graph, args)
    assert "zb_h1" in entries and "error" not in entries["zb_h1"]


def test_compare_schedules_v_rows_searched_at_each_baseline_memory():
  graph = compare_schedules_lib.build_graph("zbv", 2)
  args = CompareArgs(microbatches=8, memories=("each",), time_limit=5.0,
                     lower=False)
  entries = compare_schedules_lib.simulate_all(graph, args)
  for name in ("dualpipev", "zbv"):
    base, mine = entries[name], entries[f"tessel@={name}"]
    assert "error" not in base and "error" not in mine, (base, mine)
    assert mine["memory_limit"] == base["max_peak_memory"]
    assert mine["max_peak_memory"] <= base["max_peak_memory"]
    assert mine["makespan"] <= base["makespan"]


def test_compare_schedules_rejects_unknown_names():
  with pytest.raises(ValueError, match="unknown placements"):
    compare_schedules_lib.check_args(CompareArgs(placements=("nope",)))
  with pytest.raises(ValueError, match="memory"):
    compare_schedules_lib.check_args(CompareArgs(memories=("huge",)))
  assert set(placements.PLACEMENTS) < set(
      compare_schedules_lib.placement_names())


def test_binaries_run_from_the_command_line(tmp_path):
  out = tmp_path / "s"
  proc = subprocess.run(
      [sys.executable, "-m", "experiments.search_scaling", "--parts=devices",
       "--placements=vshape", "--devices=2", "--wrap=on",
       f"--output_dir={out}"], capture_output=True, text=True, timeout=120)
  assert proc.returncode == 0, proc.stderr
  (path,) = list(out.glob("run_*.json"))
  assert "wall" in proc.stdout
  proc = subprocess.run(
      [sys.executable, "-m", "experiments.plot_results", f"--input={path}"],
      capture_output=True, text=True, timeout=120)
  assert proc.returncode == 0, proc.stderr
  assert (out / f"{path.stem}_devices.png").exists()
