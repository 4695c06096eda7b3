"""The time/memory frontier: Pareto set, plan choice, pricing, a tiny sweep.

Pure Python (no jax) except the runner test at the end, which uses the
analytic costs (no measurement).
"""

from __future__ import annotations

import dataclasses
import json
import os
import random
import subprocess
import sys

import pytest

from tessel_jax import placements, validate
from tessel_jax.schedule import Action
from tessel_jax.graph import PlacementError
from tessel_jax.search import frontier as F
from tessel_jax.search import plan_graph as P
from tessel_jax.search import search_repetend

TINY = F.gpt_costs(F.PRESETS["tiny"], "tiny")


def _plan(step: float, peak: int, label: str = "p") -> F.PlanResult:
  return F.PlanResult(
      placement=label, pipe=1, dp=1, stages=1, groups=("all",),
      microbatches=1, memory_case="loose", memory_limit_units=None,
      stash_limit_bytes=None, source="tessel", status="OPTIMAL", period=1,
      makespan_steps=1, resolution_s=1.0, memory_unit_bytes=1,
      step_seconds=step, pipeline_seconds=step, allreduce_seconds=0.0,
      bubble_ratio=0.0, peak_bytes=peak, peak_bytes_per_device=(peak,),
      fixed_bytes=0, stash_peak_bytes=peak, search_seconds=0.0)


def _brute_pareto(points):
  out = []
  for i, p in enumerate(points):
    dominated = any(q[0] <= p[0] and q[1] <= p[1] and q != p for q in points)
    if not dominated:
      out.append(i)
  return sorted(out, key=lambda i: (points[i][0], points[i][1], i))


# --- Pareto set and choice ----------------------------------------------------

def test_pareto_hand_made_points_with_ties():
  points = [(1, 5), (2, 3), (2, 3), (3, 3), (1, 6), (4, 1), (5, 1), (1, 5),
            (4, 2)]
  # (3,3) is beaten by (2,3), (1,6) by (1,5), (5,1) and (4,2) by (4,1);
  # equal points are all kept.
  assert F.pareto_indices(points) == (0, 7, 1, 2, 5)


def test_size_label():
  assert F.size_label(16 * 2**30) == "16GiB"
  assert F.size_label(3 * 2**20) == "3MiB"
  assert F.size_label(1000) == "1000B"


def test_pareto_edge_cases():
  assert F.pareto_indices([]) == ()
  assert F.pareto_indices([(3.0, 4.0)]) == (0,)
  # Same time, different memory: only the smaller memory survives.
  assert F.pareto_indices([(1, 2), (1, 1)]) == (1,)
  # Same memory, different time: only the faster survives.
  assert F.pareto_indices([(2, 1), (1, 1)]) == (1,)


def test_pareto_matches_the_definition_on_random_points():
  rng = random.Random(0)
  for _ in range(300):
    points = [(rng.randint(0, 5), rng.randint(0, 5))
              for _ in range(rng.randint(1, 12))]
    assert list(F.pareto_indices(points)) == _brute_pareto(points), points


def test_choose_fastest_that_fits_with_ties():
  plans = [_plan(1.0, 100), _plan(2.0, 50), _plan(2.0, 40), _plan(3.0, 10)]
  assert F.choose(plans, None) == 0
  assert F.choose(plans, 100) == 0
  assert F.choose(plans, 99) == 2            # equal time: smaller peak
  assert F.choose(plans, 40) == 2            # a peak equal to the limit fits
  assert F.choose(plans, 39) == 3
  assert F.choose(plans, 9) is None


def test_frontier_object_and_round_trip():
  plans = [_plan(1.0, 100, "a"), _plan(2.0, 50, "b"), _plan(3.0, 60, "c")]
  fr = F.frontier(plans, 80, [("x", "why")])
  assert fr.pareto == (0, 1) and fr.chosen == 1
  data = json.loads(json.dumps(fr.to_dict()))
  assert data["skipped"] == [["x", "why"]]
  assert [F.PlanResult.from_dict(p) for p in data["plans"]] == plans


# --- model, slots, grouping ---------------------------------------------------

def test_gpt_costs_shapes():
  c = F.PRESETS["tiny"]
  model = F.gpt_costs(c)
  names = [l.name for l in model.layers]
  assert names == ["embed"] + [f"layer{i}" for i in range(c.layers)] + ["head"]
  head, layer = model.layers[-1], model.layers[1]
  assert head.param_bytes == (c.vocab * c.d_model + 2 * c.d_model) * 4
  assert layer.param_bytes == (12 * c.d_model ** 2 + 13 * c.d_model) * 4
  assert layer.backward_s == pytest.approx(2 * layer.forward_s)
  data = json.loads(json.dumps(model.to_dict()))
  assert F.ModelCosts.from_dict(data) == model


def test_layer_cost_rejects_bad_values():
  with pytest.raises(ValueError, match="forward_s"):
    F.LayerCost("x", 0.0, 1.0, 0, 0, 0)
  with pytest.raises(ValueError, match="param_bytes"):
    F.LayerCost("x", 1.0, 1.0, 0, -1, 0)


def test_slots_of_towers_and_branches():
  x = placements.get("xshape", 4)
  slot_of, groups = P.slots(x, "xshape")
  assert groups == 4
  assert sorted((s.group, s.rows) for s in slot_of.values()) == sorted(
      [(g, 0.5) for g in range(4)] * 2)
  k = placements.get("kshape", 4)
  slot_of, groups = P.slots(k, "kshape")
  assert groups == 3
  assert slot_of[4] == P.Slot(2, 1.0)        # the all-device join
  with pytest.raises(PlacementError, match="cannot map"):
    P.slots(placements.get("finetune", 2), "finetune")


def test_group_layers_balances_time():
  g = placements.get("vshape", 4)
  slot_of, n = P.slots(g, "vshape")
  assert P.group_layers([1.0] * 8, g, slot_of, n) == (
      (0, 2), (2, 4), (4, 6), (6, 8))
  # A heavy last layer gets a group of its own.
  groups = P.group_layers([1, 1, 1, 1, 1, 1, 6], g, slot_of, n)
  assert groups[-1] == (6, 7)
  # M-shape: the all-device block's time is split over every device, so
  # it takes more layers than a one-device block.
  m = placements.get("mshape", 4)
  slot_of, n = P.slots(m, "mshape")
  groups = P.group_layers([1.0] * 10, m, slot_of, n)
  sizes = [b - a for a, b in groups]
  assert sum(sizes) == 10 and sizes[0] >= max(sizes[1:])
  with pytest.raises(PlacementError, match="needs 5 layer groups"):
    P.group_layers([1.0] * 4, m, slot_of, n)


def test_plan_graph_memory_and_fixed_bytes():
  pg = P.plan_graph(TINY, "vshape", 2, 1, microbatches=4, optimizer_slots=2)
  g = pg.graph
  assert g.num_devices == 2 and pg.microbatches == 4
  # Each device: its groups' parameters x (params + grads + 2 Adam slots).
  for d, (a, b) in enumerate(pg.groups):
    params = sum(l.param_bytes for l in TINY.layers[a:b])
    assert pg.param_bytes[d] == params
    assert pg.fixed_bytes[d] == 4 * params
  assert pg.allreduce_seconds == 0.0         # no replica anywhere
  dp = P.plan_graph(TINY, "vshape", 2, 2, microbatches=4)
  assert dp.microbatches == 2 and dp.allreduce_seconds > 0
  with pytest.raises(ValueError, match="do not divide"):
    P.plan_graph(TINY, "vshape", 2, 3, microbatches=4)


def test_plan_graph_for_inference():
  pg = P.plan_graph(TINY, "mllm", 2, 2, microbatches=4, mode="infer")
  assert {b.kind for b in pg.graph.blocks} == {"F"}
  assert all(b.memory == 0 for b in pg.graph.blocks)
  assert pg.fixed_bytes == pg.param_bytes and pg.allreduce_seconds == 0.0
  run = search_repetend(pg.graph, None, time_limit_s=1.0).unroll(2)
  res = F.evaluate(pg, run, memory_case="loose", memory_limit_units=None,
                   status="OPTIMAL")
  assert res.stash_peak_bytes == 0 and res.peak_bytes == max(pg.param_bytes)
  with pytest.raises(ValueError, match="mode"):
    P.plan_graph(TINY, "mllm", 2, 1, microbatches=4, mode="eval")


def test_shard_shared_splits_multi_device_parameters():
  rep = P.plan_graph(TINY, "mllm", 2, 1, microbatches=4)
  shard = P.plan_graph(TINY, "mllm", 2, 1, microbatches=4, shard_shared=True)
  assert max(shard.param_bytes) < max(rep.param_bytes)
  # Gathering the shards costs time on the all-device blocks.
  assert shard.quantized.seconds[0] > rep.quantized.seconds[0]


def test_split_backward_placement_prices_w_blocks():
  pg = P.plan_graph(TINY, "zbv", 2, 1, microbatches=4)
  kinds = {b.kind for b in pg.graph.blocks}
  assert kinds == {"F", "B", "W"}
  for b in pg.graph.blocks:
    if b.kind == "B":
      assert b.memory == 0                   # W frees the stash


# --- evaluation and the sweep -------------------------------------------------

def test_evaluate_rejects_an_invalid_schedule():
  pg = P.plan_graph(TINY, "vshape", 2, 1, microbatches=2)
  run = search_repetend(pg.graph, None, time_limit_s=1.0).unroll(2)
  bad = dataclasses.replace(run, actions=tuple(
      Action(0, a.block, a.microbatch) for a in run.actions))
  with pytest.raises(validate.ScheduleValidationError):
    F.evaluate(pg, bad, memory_case="loose", memory_limit_units=None,
               status="FEASIBLE")


def test_tiny_sweep():
  fits = 5 * 2**20
  fr = F.sweep(TINY, 4, placements=("vshape", "xshape"),
               pipes=(1, 2, 4), microbatches=4, memory_levels=(0.5,),
               memory_limit=fits, time_limit_s=0.5)
  assert fr.plans and fr.memory_limit_bytes == fits
  labels = [p.label for p in fr.plans]
  assert len(set(labels)) == len(labels)
  assert {p.pipe for p in fr.plans} == {1, 2, 4}
  assert {p.source for p in fr.plans} >= {"1f1b", "gpipe", "chimera"}
  # The Pareto set is the definition's.
  points = [(p.step_seconds, p.peak_bytes) for p in fr.plans]
  assert list(fr.pareto) == _brute_pareto(points)
  # The chosen plan fits and nothing that fits is faster.
  chosen = fr.plans[fr.chosen]
  assert chosen.peak_bytes <= fits
  assert all(p.step_seconds >= chosen.step_seconds for p in fr.plans
             if p.peak_bytes <= fits)
  # Searches under a limit keep to it (in bytes: fixed + stash).
  for p in fr.plans:
    assert p.step_seconds > 0 and p.peak_bytes >= p.fixed_bytes
    if p.memory_case.startswith("limit"):
      assert p.memory_case == f"limit{F.size_label(p.memory_limit_bytes)}"
      assert p.peak_bytes <= p.memory_limit_bytes
    if p.memory_limit_units is not None:
      assert p.stash_peak_bytes <= p.stash_limit_bytes
  # Tighter limits never use more stash than the loose plan of a config.
  for p in fr.plans:
    if p.memory_case == "tight":
      loose = next(q for q in fr.plans if q.memory_case == "loose" and
                   (q.placement, q.pipe) == (p.placement, p.pipe))
      assert p.stash_peak_bytes <= loose.stash_peak_bytes


def test_sweep_records_what_it_skips():
  fr = F.sweep(TINY, 4, placements=("vshape", "interleaved"), pipes=(4,),
               microbatches=4, memory_limit=1, baselines=False,
               time_limit_s=0.5)
  reasons = " ".join(why for _, why in fr.skipped)
  assert "needs 8 layer groups" in reasons      # interleaved d4: 8 groups
  assert "nothing fits 1B per device" in reasons
  assert ("vshape pipe4 dp1 limit1B", ) == tuple(
      w for w, _ in fr.skipped if "limit" in w)
  assert fr.chosen is None


def test_sweep_rejects_bad_arguments():
  with pytest.raises(ValueError, match="not supported"):
    F.sweep(TINY, 4, placements=("alphafold",))
  with pytest.raises(ValueError, match="memory_levels"):
    F.sweep(TINY, 4, memory_levels=(1.5,))


# --- the runner ---------------------------------------------------------------

def test_frontier_runner_writes_json_and_plot(tmp_path):
  from experiments import frontier_lib, frontier_plot, runs
  args = frontier_lib.FrontierArgs(
      model="tiny", devices=2, placements=("vshape", "mllm"),
      microbatches=4, memory_limit=4 * 2**20, time_limit=0.5,
      output_dir=str(tmp_path))
  lines = []
  results = frontier_lib.run(args, log=lines.append)
  assert os.path.exists(results["output"]) and lines
  data = runs.read(results["output"])
  assert data["runner"] == "frontier"
  assert data["chosen_label"] == data["frontier"]["plans"][
      data["frontier"]["chosen"]]["label"]
  text = frontier_lib.summary(data)
  assert "Pareto set" in text and "chosen for 4 MiB" in text
  pictures = frontier_plot.plot_file(results["output"])
  assert all(os.path.getsize(p) > 0 for p in pictures)
  # Named by the arguments (less the output folder).
  assert results["output"] == runs.run_path(
      args._replace(output_dir=str(tmp_path)))


def test_frontier_runner_arguments():
  from experiments import frontier_lib
  assert frontier_lib.parse_bytes("16GiB") == 16 * 2**30
  assert frontier_lib.parse_bytes("1.5 MB") == 1_500_000
  assert frontier_lib.parse_bytes("none") is None
  with pytest.raises(ValueError, match="memory size"):
    frontier_lib.parse_bytes("lots")
  with pytest.raises(ValueError, match="pipes"):
    frontier_lib.check_args(frontier_lib.FrontierArgs(devices=4, pipes=(3,)))
  with pytest.raises(ValueError, match="analytic preset"):
    frontier_lib.check_args(frontier_lib.FrontierArgs(model="gpt9"))


def test_frontier_binary_and_plot_from_the_command_line(tmp_path):
  proc = subprocess.run(
      [sys.executable, "-m", "experiments.frontier", "--model=tiny",
       "--devices=2", "--pipes=2", "--placements=vshape",
       "--microbatches=2", "--memory_limit=4MiB", "--nobaselines",
       "--time_limit=0.5", f"--output_dir={tmp_path}"],
      capture_output=True, text=True, timeout=120)
  assert proc.returncode == 0, proc.stderr
  assert "chosen for 4 MiB per device" in proc.stdout
  (path,) = list(tmp_path.glob("run_*.json"))
  proc = subprocess.run(
      [sys.executable, "-m", "experiments.frontier_plot", str(path)],
      capture_output=True, text=True, timeout=120)
  assert proc.returncode == 0, proc.stderr
  assert (tmp_path / f"{path.stem}_frontier.png").exists()
  proc = subprocess.run(
      [sys.executable, "-m", "experiments.frontier", "--memory_limit=lots",
       f"--output_dir={tmp_path}"], capture_output=True, text=True,
      timeout=120)
  assert proc.returncode != 0 and "memory size 'lots'" in proc.stderr
