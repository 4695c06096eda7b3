"""Tests for tessel_jax.plot: Gantt pictures and Chrome traces."""

import json

import pytest

from tessel_jax.graph import make_graph
from tessel_jax.plot import chrome_trace, gantt, gantt_compare
from tessel_jax.schedule import Action, Repetend, Schedule, UnrolledSchedule

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def one_f_one_b(num_microbatches: int = 6) -> UnrolledSchedule:
  """Hand-written 1F1B on 2 devices: period 4."""
  graph = make_graph("1f1b.d2", 2, [
      (0, "F", 1, 1, (0,)), (1, "F", 1, 1, (1,)),
      (2, "B", 3, -1, (1,)), (3, "B", 3, -1, (0,))],
      [(0, 1), (1, 2), (2, 3)])
  plan = Schedule(graph, Repetend(period=4, offsets=(0, 0, 0, 1),
                                  phases=(0, 1, 2, 1)))
  return plan.unroll(num_microbatches)


def m_shape() -> UnrolledSchedule:
  """A block on two devices, plus a W block, run sequentially."""
  graph = make_graph("mini_m.d2", 2, [
      (0, "F", 1, 1, (0,)), (1, "F", 2, 1, (0, 1)), (2, "B", 2, -1, (0, 1)),
      (3, "W", 1, -1, (0,))], [(0, 1), (1, 2), (2, 3)])
  actions = []
  t = 0
  for mb in range(3):
    for block in graph.blocks:
      actions.append(Action(t, block.id, mb))
      t += block.span
  return UnrolledSchedule(graph=graph, num_microbatches=3,
                          actions=tuple(sorted(actions)), status="BASELINE",
                          source="sequential")


def test_gantt_writes_png(tmp_path):
  schedule = one_f_one_b()
  path = tmp_path / "g.png"
  fig = gantt(schedule, str(path), repetend_period=4, repetend_start=4,
              repetend_end=20)
  data = path.read_bytes()
  assert data.startswith(PNG_MAGIC) and len(data) > 1000
  ax = fig.axes[0]
  assert ax.get_xlim() == (0, schedule.makespan)
  assert [t.get_text() for t in ax.get_yticklabels()] == ["dev0", "dev1"]
  dashed = [ln for ln in ax.get_lines() if ln.get_linestyle() == "--"]
  assert [ln.get_xdata()[0] for ln in dashed] == [4, 8, 12, 16, 20]


def test_gantt_without_path_draws_one_bar_per_action():
  schedule = m_shape()  # multi-device blocks are on adjacent devices
  fig = gantt(schedule, title="mini")
  ax = fig.axes[0]
  bars = sum(len(c.get_paths()) for c in ax.collections)
  assert bars == len(schedule.actions)
  assert ax.get_title() == "mini"


def test_gantt_max_steps_crops(tmp_path):
  schedule = one_f_one_b(32)
  fig = gantt(schedule, str(tmp_path / "c.svg"), max_steps=10)
  assert fig.axes[0].get_xlim() == (0, 10)
  assert (tmp_path / "c.svg").stat().st_size > 0
  with pytest.raises(ValueError, match="max_steps"):
    gantt(schedule, max_steps=0)
  with pytest.raises(ValueError, match="repetend_period"):
    gantt(schedule, repetend_start=3)


def test_gantt_compare_stacks_on_one_axis(tmp_path):
  path = tmp_path / "cmp.png"
  fig = gantt_compare({"1f1b": one_f_one_b(3), "seq": m_shape()}, str(path),
                      title="compare")
  assert path.read_bytes().startswith(PNG_MAGIC)
  first, second = fig.axes[0], fig.axes[1]
  longest = max(one_f_one_b(3).makespan, m_shape().makespan)
  assert first.get_xlim() == second.get_xlim() == (0, longest)
  with pytest.raises(ValueError, match="at least one"):
    gantt_compare({}, None)


@pytest.mark.parametrize("make", [one_f_one_b, m_shape])
def test_chrome_trace_events(tmp_path, make):
  schedule = make()
  path = tmp_path / "t.json"
  trace = chrome_trace(schedule, str(path), step_us=250)
  assert json.loads(path.read_text()) == trace
  spans = [e for e in trace["traceEvents"] if e["ph"] == "X"]
  expected = {}
  for a in schedule.actions:
    block = schedule.graph.block(a.block)
    for d in block.devices:
      expected[(a.block, a.microbatch, d)] = (a.start * 250, block.span * 250)
  got = {(e["args"]["block"], e["args"]["microbatch"], e["tid"]):
         (e["ts"], e["dur"]) for e in spans}
  assert len(spans) == len(expected)
  assert got == expected
  assert all(e["pid"] == 0 for e in spans)
  names = {e["name"] for e in spans}
  assert "F0 mb0" in names
  threads = {e["tid"]: e["args"]["name"] for e in trace["traceEvents"]
             if e["name"] == "thread_name"}
  assert threads == {0: "dev0", 1: "dev1"}


def test_chrome_trace_rejects_bad_step():
  with pytest.raises(ValueError, match="step_us"):
    chrome_trace(one_f_one_b(), step_us=0)
