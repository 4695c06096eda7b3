"""The schedule searched on the measured spans on a coarser grid
(``quantize.coarser``, ``step_schedule.coarse_candidate``) as a third
candidate of the build's pick (``step_build._choose_plan``). Pure Python
with a fake cost model: no jax, no timing."""

from __future__ import annotations

import types

import pytest

from passes import switches as switches_lib
from passes.switches import Switches
from tessel_jax import placements, step_build, step_schedule
from tessel_jax.cost import quantize
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
  """Prices a plan by its schedule's name; no stand-in estimate."""

  calibrated = False
  bound_last = False
  extra_last_s = 0.0
  alt_standins_skipped = 0
  time_resolution = None

  def __init__(self, seconds):
    self.seconds = seconds

  def step_seconds(self, costs, run, plan, layout, mesh, pipe_axis):
    del costs, plan, layout, mesh, pipe_axis
    return self.seconds[run.name]


def _choose(monkeypatch, seconds, coarse_same=False,
            switches=Switches(coarse_grid=True)):
  model = _Model(seconds)
  step = types.SimpleNamespace(_costs=model, mesh=None, pipe_axis="pipe",
                               plan=None, screening=False,
                               switches=switches)
  step._pick_schedule = lambda *a: step_schedule.pick_schedule(step, *a)
  fine, coarse, uniform = _run("fine"), _run("coarse"), _run("uniform")
  if coarse_same:
    coarse = types.SimpleNamespace(name="coarse", actions=fine.actions)
  by_actions = {r.actions: r for r in (coarse, uniform, fine)}
  monkeypatch.setattr(step_schedule, "coarse_candidate",
                      lambda *a, **k: ("cg", "cs", coarse))
  monkeypatch.setattr(step_schedule, "uniform_candidate",
                      lambda *a, **k: ("ug", "us", uniform))
  clock = types.SimpleNamespace(lap=lambda *a: None)
  make_plan = lambda actions: types.SimpleNamespace(
      layout=None, name=by_actions[actions].name)
  return step_build._choose_plan(step, object(), None, None, 1, None, 8,
                                 fine, make_plan, clock)


def test_the_coarse_grid_schedule_is_lowered_when_predicted_faster(
    monkeypatch):
  plan, chosen, other_ms, picked = _choose(
      monkeypatch, {"fine": 0.62, "coarse": 0.56, "uniform": 0.63})
  assert (plan.name, chosen) == ("coarse", "coarse")
  assert picked[:2] == ("cg", "cs") and picked[2].name == "coarse"
  assert other_ms == pytest.approx(630.0)


def test_uniform_still_wins_over_the_coarse_one(monkeypatch):
  plan, chosen, _, picked = _choose(
      monkeypatch, {"fine": 0.62, "coarse": 0.56, "uniform": 0.50})
  assert (plan.name, chosen, picked[0]) == ("uniform", "uniform", "ug")


def test_a_slower_coarse_schedule_is_not_taken(monkeypatch):
  plan, chosen, _, picked = _choose(
      monkeypatch, {"fine": 0.56, "coarse": 0.62, "uniform": 0.63})
  assert (plan.name, chosen, picked) == ("fine", "measured", None)


def test_a_coarse_schedule_in_the_same_order_is_not_priced(monkeypatch):
  plan, chosen, _, picked = _choose(
      monkeypatch, {"fine": 0.56, "coarse": 0.01, "uniform": 0.63},
      coarse_same=True)
  assert (plan.name, chosen, picked) == ("fine", "measured", None)


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
  plan, chosen, _, picked = _choose(
      monkeypatch, {"fine": 0.62, "coarse": 0.56, "uniform": 0.63},
      switches=Switches(coarse_grid=False))
  assert (plan.name, chosen, picked) == ("fine", "measured", None)


def test_on_by_default_and_the_environment_turns_it_off():
  assert Switches().coarse_grid and switches_lib.from_env({}).coarse_grid
  assert not switches_lib.from_env(
      {switches_lib.COARSE_GRID_ENV: "0"}).coarse_grid
