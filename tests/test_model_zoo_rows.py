"""experiments.model_zoo_rows: the zoo runners' shared per-model loop."""

from __future__ import annotations

import json
from typing import NamedTuple

from experiments import model_zoo_rows, realtime


class _Args(NamedTuple):
  models: tuple[str, ...] = ("a", "b")
  output: str | None = None


def test_a_failing_model_becomes_an_error_row_and_priority_is_restored(
    monkeypatch):
  restored = []
  monkeypatch.setattr(realtime, "normal_priority",
                      lambda: restored.append(1) or 0)

  def row(name):
    if name == "b":
      raise ValueError("no such layer")
    return {"model": name, "ms": 1.0}

  logged = []
  rows = model_zoo_rows.each_model(("a", "b"), row, logged.append)
  assert rows == [{"model": "a", "ms": 1.0},
                  {"model": "b", "error": "ValueError: no such layer"}]
  assert [json.loads(x) for x in logged] == rows
  assert len(restored) == 2


def test_write_rows_writes_table_and_record(tmp_path):
  out = tmp_path / "r.json"
  logged = []
  rec = model_zoo_rows.write_rows(
      _Args(output=str(out)), [{"model": "a"}],
      lambda rows: "| " + rows[0]["model"] + " |", [1.0, 2.0, 3.0],
      {"machine": {"per_port_s": 1e-6}}, logged.append)
  assert logged == ["| a |"]
  disk = json.loads(out.read_text())
  assert disk["rows"] == [{"model": "a"}] and disk["table"] == "| a |"
  assert disk["machine"] == {"per_port_s": 1e-6}
  assert disk["args"]["models"] == ["a", "b"]
  assert rec["load_average_start"] == [1.0, 2.0, 3.0]
  assert len(rec["load_average_end"]) == 3
