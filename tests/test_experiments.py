"""The search runners end to end on small cases (no flags involved)."""

from __future__ import annotations

import io
import json
import subprocess
import sys

from experiments import search_cases_lib, search_lib
from experiments.search_lib import SearchArgs
from experiments.search_cases_lib import CasesArgs
from tessel_jax import validate
from tessel_jax.graph import BlockGraph
from tessel_jax.schedule import UnrolledSchedule


def test_search_runner_writes_valid_schedule_and_picture(tmp_path):
  out, png = tmp_path / "s.json", tmp_path / "s.png"
  args = SearchArgs(placement="mshape", devices=4, memory=6, microbatches=16,
                    output=str(out), plot=str(png), timing=False)
  text = io.StringIO()
  assert search_lib.main(args, out=text) == 0
  report = text.getvalue()
  assert "period" in report and "makespan" in report and "dev0" in report
  data = json.loads(out.read_text())
  assert data["num_microbatches"] == 16 and "search_seconds" not in data
  graph = search_lib.load_graph("mshape", 4)
  validate.assert_valid(UnrolledSchedule.from_dict(data, graph))
  assert png.stat().st_size > 0


def test_search_runner_reports_infeasible_memory(tmp_path):
  args = SearchArgs(placement="vshape", devices=4, memory=0, microbatches=4)
  text = io.StringIO()
  assert search_lib.main(args, out=text, err=text) == (
      search_lib.EXIT_INFEASIBLE)
  assert "smallest limit that works is 1" in text.getvalue()


def test_search_runner_reads_placement_file(tmp_path):
  graph = search_lib.load_graph("kshape", 4)
  path = tmp_path / "case.json"
  path.write_text(graph.to_json())
  assert BlockGraph.from_json(path.read_text()) == graph
  args = SearchArgs(placement_file=str(path), memory=8, microbatches=8)
  assert search_lib.main(args, out=io.StringIO()) == 0


def test_search_cases_records_every_case(tmp_path):
  out = tmp_path / "cases.json"
  args = CasesArgs(placements=("vshape", "mshape"), devices=(2,),
                   microbatches=8, time_limit=10.0, output=str(out))
  results = search_cases_lib.run(args, log=lambda *_: None)
  data = json.loads(out.read_text())
  cases = data["cases"]
  assert {c["placement"] for c in cases} == {"vshape", "mshape"}
  assert all("error" not in c or not c["error"] for c in cases)
  table = search_cases_lib.markdown(results)
  assert "vshape" in table and "mshape" in table


def test_search_cases_middle_limit_lies_between_tight_and_fast():
  graph = search_lib.load_graph("mllm", 4)
  rows = search_cases_lib.memory_cases(
      graph, ("tight", "middle", "fast"), allow_wrap=True, time_limit_s=10,
      seed=0, workers=1)
  limits = {r["memory_case"]: r["memory_limit"] for r in rows}
  assert [r["memory_case"] for r in rows] == ["tight", "middle", "fast"]
  assert limits == {"tight": 3, "middle": 7, "fast": 12}
  only = search_cases_lib.memory_cases(
      graph, ("middle",), allow_wrap=True, time_limit_s=10, seed=0,
      workers=1)
  assert [(r["memory_case"], r["memory_limit"]) for r in only] == [
      ("middle", 7)]


def test_search_binary_runs_from_the_command_line(tmp_path):
  out = tmp_path / "v.json"
  proc = subprocess.run(
      [sys.executable, "-m", "experiments.search", "--placement=vshape",
       "--devices=2", "--memory=2", "--microbatches=6", f"--output={out}",
       "--notiming"], capture_output=True, text=True, timeout=120)
  assert proc.returncode == 0, proc.stderr
  first = out.read_text()
  subprocess.run(
      [sys.executable, "-m", "experiments.search", "--placement=vshape",
       "--devices=2", "--memory=2", "--microbatches=6", f"--output={out}",
       "--notiming"], capture_output=True, text=True, timeout=120, check=True)
  assert out.read_text() == first
