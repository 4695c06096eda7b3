"""BlockGraph invariants, errors and the DESIGN §4 JSON round trip."""

from __future__ import annotations

import json

import pytest

from tessel_jax.graph import Block, BlockGraph, Edge, PlacementError, make_graph
from tessel_jax.schedule import Repetend, Schedule, UnrolledSchedule


def two_stage(**overrides) -> dict:
  data = {
      "name": "v2", "num_devices": 2,
      "blocks": [
          {"id": 0, "kind": "F", "span": 1, "memory": 1, "devices": [0]},
          {"id": 1, "kind": "F", "span": 1, "memory": 1, "devices": [1]},
          {"id": 2, "kind": "B", "span": 3, "memory": -1, "devices": [1]},
          {"id": 3, "kind": "B", "span": 3, "memory": -1, "devices": [0]},
      ],
      "edges": [[0, 1], [1, 2], [2, 3]],
  }
  data.update(overrides)
  return data


def test_json_round_trip_is_exact():
  graph = BlockGraph.from_dict(two_stage())
  again = BlockGraph.from_json(graph.to_json())
  assert again == graph
  assert json.loads(graph.to_json()) == two_stage()


def test_edge_delays_round_trip():
  graph = BlockGraph.from_dict(two_stage()).with_delays(2)
  assert [e.delay for e in graph.edges] == [2, 0, 2]
  assert BlockGraph.from_json(graph.to_json()) == graph


def test_dag_with_branches_is_accepted():
  graph = make_graph("k", 2, [
      (0, "F", 1, 1, (0,)), (1, "F", 1, 1, (1,)), (2, "F", 1, 0, (0, 1)),
      (3, "B", 1, -1, (0,)), (4, "B", 1, -1, (1,))],
      [(0, 2), (1, 2), (2, 3), (2, 4)])
  order = graph.topological_order()
  assert order.index(2) > order.index(0) and order.index(2) > order.index(1)


@pytest.mark.parametrize("mutate, message", [
    (lambda d: d["edges"].append([3, 0]), "cycle"),
    (lambda d: d["blocks"][0].update(devices=[5]), "uses device 5"),
    (lambda d: d["blocks"][0].update(span=0), "block 0 span must be .* got 0"),
    (lambda d: d["blocks"][1].update(id=0), "used twice"),
    (lambda d: d["edges"].append([0, 9]), "does not exist"),
    (lambda d: d.update(num_devices=3), "device 2 runs no block"),
    (lambda d: d["blocks"][3].update(memory=0), "never returns to zero"),
    (lambda d: d["blocks"][0].update(kind="X"), "kind 'X'"),
])
def test_bad_placements_get_clear_errors(mutate, message):
  data = two_stage()
  mutate(data)
  with pytest.raises(PlacementError, match=message):
    BlockGraph.from_dict(data)


def test_missing_json_field_is_named():
  data = two_stage()
  del data["num_devices"]
  with pytest.raises(PlacementError, match="num_devices"):
    BlockGraph.from_dict(data)


def test_schedule_json_round_trip():
  graph = BlockGraph.from_dict(two_stage())
  plan = Schedule(graph, Repetend(4, (0, 0, 0, 1), (0, 1, 2, 1)),
                  memory_limit=2)
  unrolled = plan.unroll(6)
  text = unrolled.to_json()
  back = UnrolledSchedule.from_json(text, graph)
  assert back.actions == unrolled.actions
  assert back.to_json() == text
  data = json.loads(text)
  for key in ("placement", "memory_limit", "num_microbatches", "period",
              "repetend_microbatches", "makespan", "peak_memory", "status",
              "search_seconds", "actions"):
    assert key in data
  assert data["peak_memory"] == [2, 1]


def test_schedule_json_for_another_placement_is_refused():
  graph = BlockGraph.from_dict(two_stage())
  unrolled = Schedule(graph, Repetend(4, (0, 0, 0, 1), (0, 1, 2, 1))).unroll(2)
  other = BlockGraph.from_dict(two_stage(name="other"))
  with pytest.raises(ValueError, match="placement 'v2'"):
    UnrolledSchedule.from_json(unrolled.to_json(), other)


def test_grid_shows_blocks_and_idle_steps():
  graph = BlockGraph.from_dict(two_stage())
  grid = Schedule(graph, Repetend(4, (0, 0, 0, 1), (0, 1, 2, 1))).unroll(2).grid()
  lines = grid.splitlines()
  assert lines[1].startswith("dev0") and "F0.0" in lines[1]
  assert "B2.1" in lines[2] and "." in lines[2]
