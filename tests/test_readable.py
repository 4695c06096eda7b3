"""Schedules a person can read: one block naming, folded grid, labelled PNG."""

from __future__ import annotations

import re

import pytest

from tessel_jax import placements, plot
from tessel_jax.search import baselines, search_repetend


def _searched(n=16):
  return search_repetend(placements.mshape(4), None).unroll(n)


def test_grid_folds_to_the_width_with_a_legend():
  run = _searched()
  for width in (80, 120):
    text = run.grid(max_steps=None, width=width)
    assert max(len(line) for line in text.splitlines()) <= width
    assert text.count("step ") >= run.makespan * 5 // width  # several bands
  text = run.grid(max_steps=None)
  assert "legend:" in text and "shared by several devices: F0, B0" in text
  one = run.grid(max_steps=None, width=None, legend=False)
  assert one.count("step ") == 1


def test_grid_names_blocks_by_forward_index_like_the_pictures():
  run = _searched()
  grid_names = set(re.findall(r"\b([FBW]\d+)\.\d+", run.grid(max_steps=None)))
  trace = plot.chrome_trace(run)
  trace_names = {e["name"].split()[0] for e in trace["traceEvents"]
                 if e["ph"] == "X"}
  json_names = {b.label for b in run.graph.blocks}
  assert grid_names == trace_names == json_names
  assert {"F4", "B4", "B0"} <= grid_names  # not block ids (B5..B9)
  fig = plot.gantt(run)
  drawn = {t.get_text().replace("\n", ".") for t in fig.axes[0].texts}
  bars = {f"{run.graph.block(a.block).label}.{a.microbatch}"
          for a in run.actions}
  assert drawn == bars   # every block labelled


def test_png_states_units_and_marks_shared_blocks():
  fig = plot.gantt(_searched())
  ax = fig.axes[0]
  assert "peak memory" in ax.get_title() and "units" in ax.get_title()
  assert "steps" in ax.get_xlabel()
  legend = [t.get_text() for t in ax.get_legend().get_texts()]
  assert "shared by devices" in legend


def test_compare_is_one_call(tmp_path):
  run = _searched()
  classic = baselines.run("1f1b", run.graph, 16)
  fig = plot.compare(run, classic, str(tmp_path / "c.png"))
  assert (tmp_path / "c.png").stat().st_size > 1000
  title = fig._suptitle.get_text()  # pylint: disable=protected-access
  assert f"tessel {run.makespan} steps vs 1f1b {classic.makespan}" in title
  assert "shorter" in title
  with pytest.raises(ValueError, match="same placement"):
    plot.compare(run, baselines.run("gpipe", run.graph, 8))
