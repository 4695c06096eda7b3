"""The schedule searched on the measured spans on a coarser grid
(``quantize.coarser``, ``step_schedule.coarse_candidate``) as a third
candidate of the build's pick (``step_build._choose_plan``,
``schedule_choice.choose``: one loop prices each distinct candidate once).
Pure Python
with a fake cost model: no jax, no timing."""

from __future__ import annotations

import dataclasses
import types

import pytest

from passes import switches as switches_lib
from passes.switches import Switches
from tessel_jax import placements, step_build, step_schedule
from tessel_jax.cost import quantize, report
from tessel_jax.graph import Edge
from tessel_jax.schedule import Action

# peer_bench's 4-stage mshape, its kernels measured beside two busy
# processes (ms per micro-batch; F0 and B0 run on all four devices).
LOADED_MS = {"F0": 10.68, "F1": 8.32, "F2": 8.32, "F3": 8.32, "F4": 8.63,
             "B4": 15.99, "B3": 17.58, "B2": 17.58, "B1": 17.58,
             "B0": 18.66}


def _loaded() -> quantize.Quantized:
  graph = placements.mshape(4)
  seconds = {b.id: LOADED_MS[b.label] * 1e-3 for b in graph.blocks}
  memory = {b.id: (1000 if b.kind == "F" else -1000) for b in graph.blocks}
  return quantize.quantize(graph, seconds, memory)


def _busiest(graph) -> int:
  return max(sum(b.span for b in graph.blocks_on(d))
             for d in range(graph.num_devices))


def test_coarser_grid_is_the_least_error_one_of_half_to_all_steps():
  q = _loaded()
  # The default (5%) grid: 19 steps on the busiest device; at 13 the
  # rounding error is 5.4%, so a few per cent of noise moves it that far.
  assert _busiest(q.graph) == 19
  coarse = quantize.coarser(q)
  assert _busiest(coarse) == 13
  spans = {b.label: b.span for b in coarse.blocks}
  assert [spans[l] for l in LOADED_MS] == [3, 2, 2, 2, 2, 4, 4, 4, 4, 4]
  # Memory units and the graph's structure are kept.
  assert [b.memory for b in coarse.blocks] == [b.memory
                                               for b in q.graph.blocks]
  assert [(b.id, b.devices) for b in coarse.blocks] == [
      (b.id, b.devices) for b in q.graph.blocks]


def test_no_coarser_grid_with_the_same_spans():
  graph = placements.vshape(2)
  q = quantize.quantize(graph, {0: 1e-3, 1: 1e-3, 2: 1e-3, 3: 1e-3})
  assert _busiest(q.graph) == 2
  assert quantize.coarser(q) is None


def _run(name: str) -> types.SimpleNamespace:
  """An unrolled schedule named ``name`` of two blocks, in its own order
  (fine: 0 then 1; coarse: 1 then 0; uniform: together)."""
  starts = {"fine": (0, 1), "coarse": (1, 0), "uniform": (0, 0)}[name]
  return types.SimpleNamespace(name=name, actions=tuple(
      Action(block=b, microbatch=0, start=s) for b, s in enumerate(starts)))


class _Model:
  """Prices a plan by its schedule's name (counting each price); no
  stand-in estimate."""

  calibrated = False
  bound_last = False
  extra_last_s = 0.0
  alt_standins_skipped = 0
  time_resolution = None

  def __init__(self, seconds):
    self.seconds = seconds
    self.priced = []

  def step_seconds(self, costs, run, plan, layout, mesh, pipe_axis):
    del costs, plan, layout, mesh, pipe_axis
    self.priced.append(run.name)
    return self.seconds[run.name]


def _choose(monkeypatch, seconds, coarse_same=False,
            switches=Switches(coarse_grid=True), uniform_same=False):
  """``step_build._choose_plan`` of the fake candidates: ``(plan, choice,
  picked, names of the schedules priced)``."""
  model = _Model(seconds)
  step = types.SimpleNamespace(_costs=model, mesh=None, pipe_axis="pipe",
                               plan=None, screening=False,
                               switches=switches)
  fine, coarse, uniform = _run("fine"), _run("coarse"), _run("uniform")
  if coarse_same:
    coarse = types.SimpleNamespace(name="coarse", actions=fine.actions)
  if uniform_same:
    uniform = types.SimpleNamespace(name="uniform", actions=coarse.actions)
  # (a twin plans as the earlier candidate it copies)
  by_actions = {r.actions: r for r in (uniform, coarse, fine)}
  monkeypatch.setattr(step_schedule, "coarse_candidate",
                      lambda *a, **k: ("cg", "cs", coarse))
  monkeypatch.setattr(step_schedule, "uniform_candidate",
                      lambda *a, **k: ("ug", "us", uniform))
  clock = types.SimpleNamespace(lap=lambda *a: None)
  make_plan = lambda actions: types.SimpleNamespace(
      layout=None, name=by_actions[actions].name)
  plan, choice, picked = step_build._choose_plan(
      step, object(), None, None, 1, None, 8, fine, make_plan, clock)
  return plan, choice, picked, model.priced


def test_the_coarse_grid_schedule_is_lowered_when_predicted_faster(
    monkeypatch):
  plan, choice, picked, priced = _choose(
      monkeypatch, {"fine": 0.62, "coarse": 0.56, "uniform": 0.63})
  assert (plan.name, choice.taken) == ("coarse", "coarse")
  assert picked[:2] == ("cg", "cs") and picked[2].name == "coarse"
  assert priced == ["fine", "coarse", "uniform"]
  assert choice.candidate_ms == pytest.approx(
      {"measured": 620.0, "coarse": 560.0, "uniform": 630.0})
  # The runner-up's price.
  assert choice.alternative_ms == pytest.approx(620.0)


def test_uniform_still_wins_over_the_coarse_one(monkeypatch):
  plan, choice, picked, _ = _choose(
      monkeypatch, {"fine": 0.62, "coarse": 0.56, "uniform": 0.50})
  assert (plan.name, choice.taken, picked[0]) == ("uniform", "uniform", "ug")
  assert choice.alternative_ms == pytest.approx(560.0)


def test_a_slower_coarse_schedule_is_not_taken(monkeypatch):
  plan, choice, picked, _ = _choose(
      monkeypatch, {"fine": 0.56, "coarse": 0.62, "uniform": 0.63})
  assert (plan.name, choice.taken, picked) == ("fine", "measured", None)


def test_a_coarse_schedule_in_the_same_order_is_not_priced(monkeypatch):
  plan, choice, picked, priced = _choose(
      monkeypatch, {"fine": 0.56, "coarse": 0.01, "uniform": 0.63},
      coarse_same=True)
  assert (plan.name, choice.taken, picked) == ("fine", "measured", None)
  assert priced == ["fine", "uniform"]
  assert choice.twins == {"coarse": "measured"}
  assert choice.candidate_ms == pytest.approx(
      {"measured": 560.0, "coarse": 560.0, "uniform": 630.0})
  assert list(choice.candidate_ms) == ["measured", "coarse", "uniform"]


def test_each_distinct_candidate_is_priced_once_and_the_cheapest_lowered(
    monkeypatch):
  # Uniform orders the blocks as the coarse grid does: three candidates,
  # two distinct schedules priced once each (the first is not priced
  # again for the third), the cheaper lowered.
  plan, choice, picked, priced = _choose(
      monkeypatch, {"fine": 0.62, "coarse": 0.56, "uniform": 0.01},
      uniform_same=True)
  assert priced == ["fine", "coarse"]
  assert (plan.name, choice.taken, picked[0]) == ("coarse", "coarse", "cg")
  assert choice.twins == {"uniform": "coarse"}
  assert choice.candidate_ms["uniform"] == pytest.approx(560.0)


def test_a_tie_keeps_the_earlier_candidate(monkeypatch):
  plan, choice, picked, _ = _choose(
      monkeypatch, {"fine": 0.56, "coarse": 0.56, "uniform": 0.56})
  assert (plan.name, choice.taken, picked) == ("fine", "measured", None)


def test_only_twins_are_priced_once_as_the_lowered_one(monkeypatch):
  # Every other candidate in the first one's order: one price, and the
  # report's alternative is the lowered plan's own (test_cost's
  # same-order test checks it on a real build).
  plan, choice, picked, priced = _choose(
      monkeypatch, {"fine": 0.56, "coarse": 0.5, "uniform": 0.5},
      coarse_same=True, uniform_same=True)
  assert priced == ["fine"] and (choice.taken, picked) == ("measured", None)
  assert choice.alternative_ms == pytest.approx(560.0)


def test_nothing_is_priced_without_another_candidate(monkeypatch):
  monkeypatch.setattr(step_schedule, "coarse_candidate", lambda *a, **k: None)
  monkeypatch.setattr(step_schedule, "uniform_candidate",
                      lambda *a, **k: None)
  model = _Model({})
  step = types.SimpleNamespace(_costs=model, mesh=None, pipe_axis="pipe",
                               plan=None, screening=False,
                               switches=Switches())
  fine = _run("fine")
  plan, choice, picked = step_build._choose_plan(
      step, object(), None, None, 1, None, 8, fine,
      lambda actions: types.SimpleNamespace(layout=None, name="fine"),
      types.SimpleNamespace(lap=lambda *a: None))
  assert (plan.name, choice, picked, model.priced) == ("fine", None, None,
                                                       [])


def test_the_summary_names_the_taken_and_the_others():
  rep = report.CostReport(
      cost="measured", predicted_step_ms=560.0, peak_memory_bytes=(0,),
      stash_peak_bytes=(0,), bubble_ratio=0.1, quantization_error=None,
      block_error=0.0, time_resolution_s=1e-3, memory_unit_bytes=1,
      memory_limit_bytes=None, profile_seconds=0.0, cache_hit=True,
      kernels_measured=0, schedule_costs="coarse", alternative_ms=620.0,
      candidate_ms={"measured": 620.0, "coarse": 560.0, "uniform": 630.0})
  line = rep.summary()
  assert ("schedule searched on coarse spans of candidates predicted"
          " measured 620.00 ms, coarse 560.00 ms, uniform 630.00 ms") in line
  assert "uniform spans" not in line and "measured spans" not in line


def test_no_coarse_search_in_a_cheap_screening_build_or_given_resolution():
  q = _loaded()
  costs = types.SimpleNamespace(quantized=q)
  for model_res, cheap in ((None, True), (1e-3, False)):
    step = types.SimpleNamespace(
        _costs=types.SimpleNamespace(time_resolution=model_res),
        cheap_screening=cheap)
    assert step_schedule.coarse_candidate(step, costs, 1, None, 8) is None


def test_the_coarse_grid_is_not_tried_with_the_switch_off(monkeypatch):
  # Switches(coarse_grid=False): the coarse grid's schedule, though priced
  # faster here, is not lowered (two candidates, as before).
  plan, choice, picked, priced = _choose(
      monkeypatch, {"fine": 0.62, "coarse": 0.56, "uniform": 0.63},
      switches=Switches(coarse_grid=False))
  assert (plan.name, choice.taken, picked) == ("fine", "measured", None)
  assert priced == ["fine", "uniform"] and "coarse" not in choice.candidate_ms


def test_on_by_default_and_the_environment_turns_it_off():
  assert Switches().coarse_grid and switches_lib.from_env({}).coarse_grid
  assert not switches_lib.from_env(
      {switches_lib.COARSE_GRID_ENV: "0"}).coarse_grid


def _coarser_by_hand(q: quantize.Quantized):
  """``quantize.coarser`` as it rebuilt the spans and edge delays itself
  (session 34), memory units kept: the reference it is checked against."""
  busiest = max(quantize._loads(q.graph, q.seconds))
  steps = int(round(busiest / q.resolution))
  best, best_err = None, float("inf")
  for s in range(steps - 1, (steps + 1) // 2 - 1, -1):
    _, weighted, load = quantize._errors(q.graph, q.seconds, busiest / s)
    if max(weighted, load) < best_err - 1e-12:
      best, best_err = busiest / s, max(weighted, load)
  if best is None:
    return None
  blocks = tuple(dataclasses.replace(
      b, span=quantize.to_steps(q.seconds[b.id], best))
                 for b in q.graph.blocks)
  if [b.span for b in blocks] == [b.span for b in q.graph.blocks]:
    return None
  edges = tuple(Edge(e.src, e.dst, quantize.to_steps(
      q.delay_seconds.get((e.src, e.dst), 0.0), best, minimum=0))
                for e in q.graph.edges)
  return dataclasses.replace(q.graph, blocks=blocks, edges=edges)


@pytest.mark.parametrize("units", [quantize.MEMORY_UNITS, 5])
def test_coarser_requantizes_as_the_hand_copy_did(units):
  # Spans, edge delays (communication between devices) and memory units
  # (also with another memory_units than the default) as before.
  graph = placements.mshape(4)
  seconds = {b.id: LOADED_MS[b.label] * 1e-3 for b in graph.blocks}
  memory = {b.id: (1000 + 37 * int(b.label[1:])) * (1 if b.kind == "F"
                                                     else -1)
            for b in graph.blocks}
  delays = {(e.src, e.dst): 1.3e-3 * (1 + e.src % 3) for e in graph.edges}
  q = quantize.quantize(graph, seconds, memory, delays, memory_units=units)
  got, want = quantize.coarser(q), _coarser_by_hand(q)
  assert want is not None and got == want
  assert any(e.delay > 0 for e in got.edges)
  assert [b.memory for b in got.blocks] == [b.memory for b in q.graph.blocks]
  same = quantize.quantize(placements.vshape(2),
                           {0: 1e-3, 1: 1e-3, 2: 1e-3, 3: 1e-3})
  assert quantize.coarser(same) is None and _coarser_by_hand(same) is None
