"""The main job's step clocks: process CPU per step and the host's steal
(``experiments.host_steal``, ``experiments.train_lib``), which tell a
disturbed run from a slower program."""

from __future__ import annotations

from experiments import host_steal, train_lib


def test_steal_is_the_eighth_figure(tmp_path):
  stat = tmp_path / "stat"
  stat.write_text("cpu  10 0 20 30 0 0 0 250 0 0\ncpu0 1 0 2 3 0 0 0 125 0 0\n")
  assert host_steal.steal_seconds(str(stat)) == 250 / host_steal._TICKS


def test_no_steal_figure_is_none(tmp_path):
  stat = tmp_path / "stat"
  stat.write_text("cpu  10 0 20 30\n")
  assert host_steal.steal_seconds(str(stat)) is None
  assert host_steal.steal_seconds(str(tmp_path / "missing")) is None


def test_step_clocks_median_cpu_after_the_first_step():
  record = {"step_cpu_seconds": [9.0, 0.2, 0.1, 0.3], "steal_seconds": 1.5}
  line = train_lib._step_clocks(record)
  assert record["measured_step_cpu_ms"] == 200.0
  assert "200.0 ms" in line and "1.50 s" in line
  record = {"step_cpu_seconds": [9.0, 0.1], "steal_seconds": None}
  assert "n/a" in train_lib._step_clocks(record)
