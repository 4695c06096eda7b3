"""``schedule_choice.choose`` under ``cost="calibrated"``: the schedule
searched on uniform spans is priced first with the measured-spans plan's
stand-in seconds per kernel call; its own stand-in program is compiled and timed
only when that estimate may win (``ALT_STANDIN_MARGIN``). Fake cost model:
no jax, no timing."""

from __future__ import annotations

import types

import pytest

from tessel_jax import schedule_choice as S


class _Model:
  """Prices by schedule name; counts the full (stand-in) prices."""

  calibrated = True

  def __init__(self, full, guess, bound_last=False):
    self.full, self.guess, self.bound_last = full, guess, bound_last
    self.extra_last_s = 1e-4
    self.full_priced = []
    self.alt_standins_skipped = 0

  def step_seconds(self, costs, run, plan, layout, mesh, pipe_axis):
    del costs, plan, layout, mesh, pipe_axis
    self.full_priced.append(run.actions)
    return self.full[run.actions]

  def replay_like(self, costs, run, plan, mesh, pipe_axis, extra_s):
    del costs, plan, mesh, pipe_axis
    assert extra_s == self.extra_last_s
    return self.guess[run.actions]

  def serial_seconds(self, costs, plan, layout, mesh, pipe_axis):
    del costs, plan, layout, mesh, pipe_axis
    return 0.0, 0.001


def _pick(model):
  """``(plan, taken, other's ms, picked)`` of the choice between the
  schedules named "measured" and "uniform"."""
  step = types.SimpleNamespace(_costs=model, mesh=None,
                               pipe_axis="pipe")
  mine = types.SimpleNamespace(actions="measured")
  alt = (None, None, types.SimpleNamespace(actions="uniform"))
  choice = S.choose(
      step, None, mine, types.SimpleNamespace(layout=None, name="measured"),
      [S.Candidate("uniform", "uniform spans", lambda: alt)],
      lambda actions: types.SimpleNamespace(layout=None, name=actions),
      types.SimpleNamespace(lap=lambda *a: None))
  chosen = choice.chosen
  return chosen.plan, choice.taken, choice.alternative_ms, chosen.found


def test_a_uniform_schedule_estimated_well_slower_times_no_standin():
  model = _Model({"measured": 0.010, "uniform": 0.008},
                 {"uniform": 0.0125})   # + 1 ms serial: 13.5 ms >= 11 ms
  plan, chosen, other_ms, picked = _pick(model)
  assert model.full_priced == ["measured"] and model.alt_standins_skipped == 1
  assert (plan.name, chosen, picked) == ("measured", "measured", None)
  assert other_ms == pytest.approx(13.5)


def test_a_close_uniform_schedule_is_priced_with_its_own_standin():
  model = _Model({"measured": 0.010, "uniform": 0.008},
                 {"uniform": 0.0095})   # 10.5 ms: within 10% of 10 ms
  plan, chosen, other_ms, picked = _pick(model)
  assert model.full_priced == ["measured", "uniform"]
  assert (plan.name, chosen) == ("uniform", "uniform")
  assert other_ms == pytest.approx(10.0) and picked is not None


def test_no_estimate_from_a_bound_price():
  model = _Model({"measured": 0.010, "uniform": 0.012}, {"uniform": 1.0},
                 bound_last=True)
  _, chosen, _, _ = _pick(model)
  assert model.full_priced == ["measured", "uniform"]
  assert chosen == "measured"


def test_guess_reads_only_the_figure_it_is_given():
  # The model's own last figure is stale (another plan priced since): the
  # estimate must use the figure passed in, and none without one.
  model = _Model({}, {"uniform": 0.0125})
  model.extra_last_s = 7.0
  seen = []
  model.replay_like = lambda costs, run, plan, mesh, pipe_axis, extra_s: (
      seen.append(extra_s) or model.guess[run.actions])
  step = types.SimpleNamespace(_costs=model, mesh=None, pipe_axis="pipe")
  run = types.SimpleNamespace(actions="uniform")
  p = types.SimpleNamespace(layout=None)
  assert S._guess_alt(step, None, run, p, 2e-4) == pytest.approx(0.0135)
  assert seen == [2e-4]
  assert S._guess_alt(step, None, run, p, None) is None and seen == [2e-4]


def test_standin_extra_none_without_a_timed_standin():
  model = _Model({}, {})
  assert S.standin_extra(model) == pytest.approx(1e-4)
  model.bound_last = True
  assert S.standin_extra(model) is None
  model.bound_last, model.extra_last_s = False, 0.0
  assert S.standin_extra(model) is None
