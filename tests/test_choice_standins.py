"""One build's close candidate schedules: their stand-ins timed again side by
side before the cheapest is lowered (``tessel_jax.choice_standins``, called
by ``schedule_choice.choose``). A fake cost model and a fake sample timer
whose load factor is shared by the stand-ins of one turn: a stand-in timed
alone in a quiet window is priced low, while the paired ratio of every round
is the true one. The last test builds a real program."""

from __future__ import annotations

import json
import random
import types

import jax
import pytest

import tessel_jax as tj
from tessel_jax import choice_standins as CS
from tessel_jax import placements
from tessel_jax import schedule_choice as S
from tessel_jax.passes.switches import Switches

from test_cost import _tiny

pytestmark = pytest.mark.usefixtures("shared_tick_costs")

#: True stand-in seconds and kernel seconds of two schedules: "measured"
#: is truly slower (15 ms against 13 ms).
TRUE_STANDIN = {"measured": 0.010, "uniform": 0.008}
KERNELS = {"measured": 0.005, "uniform": 0.005}


class _Model:
  """Prices a schedule as its kernels plus its stand-in's seconds."""

  calibrated = True
  bound_last = False
  alt_standins_skipped = 0

  def __init__(self, single):
    self.standin = dict(single)        # the single timings of the build
    self.stored = {}
    self.extra_last_s = 1e-4

  def _standin_seconds(self, plan, mesh, pipe_axis):
    del mesh, pipe_axis
    return self.standin[plan.name]

  def set_standin_seconds(self, plan, mesh, pipe_axis, seconds):
    del mesh, pipe_axis
    self.standin[plan.name] = self.stored[plan.name] = seconds

  def step_seconds(self, costs, run, plan, layout, mesh, pipe_axis):
    del costs, run, layout, mesh, pipe_axis
    return KERNELS[plan.name] + self.standin[plan.name]

  def replay_like(self, *args):
    return 0.0    # may win: its own stand-in is timed (ALT_STANDIN_MARGIN)

  def serial_seconds(self, *args):
    return 0.0, 0.0


def _windows(seed=3):
  """``timed_sampler`` stand-in: each call returns the run's true seconds
  times the turn's load factor (0.75-1.25, shared by one turn)."""
  rng = random.Random(seed)
  state = {"factor": 1.0, "seen": set()}

  def sampler(run):
    def sample():
      name = run()
      if not state["seen"] or name in state["seen"]:
        state["factor"], state["seen"] = rng.uniform(0.75, 1.25), set()
      state["seen"].add(name)
      return TRUE_STANDIN[name] * state["factor"]
    return sample
  return sampler


@pytest.fixture
def fake_programs(monkeypatch):
  """Kept stand-in runners by plan name (``calibrate.kept_runner``)."""
  kept = {}
  monkeypatch.setattr(CS._calibrate, "standin_plan", lambda plan: plan)
  monkeypatch.setattr(CS._calibrate, "kept_runner",
                      lambda programs, plan: kept.get(plan.name))
  monkeypatch.setattr(CS._paired, "timed_sampler", _windows())
  for name in TRUE_STANDIN:
    kept[name] = (lambda n: lambda: n)(name)
  return kept


def _choose(model, programs=object()):
  step = types.SimpleNamespace(_costs=model, mesh=None, pipe_axis="pipe",
                               choice_standins=programs)
  alt = (None, None, types.SimpleNamespace(actions="uniform"))
  return S.choose(
      step, None, types.SimpleNamespace(actions="measured"),
      types.SimpleNamespace(layout=None, name="measured"),
      [S.Candidate("uniform", "uniform spans", lambda: alt)],
      lambda actions: types.SimpleNamespace(layout=None, name=actions),
      types.SimpleNamespace(lap=lambda *a: None))


def test_a_quiet_window_no_longer_wins_the_choice(fake_programs):
  del fake_programs
  # "measured"'s stand-in was timed in a quiet window (x0.7): 12 ms against
  # uniform's 13 ms, though it is truly the slower one.
  model = _Model({"measured": 0.007, "uniform": 0.008})
  choice = _choose(model)
  assert choice.taken == "uniform"
  assert set(model.stored) == {"measured", "uniform"}
  # The true ratio, the single timings' geometric mean kept.
  assert model.stored["measured"] / model.stored["uniform"] == pytest.approx(
      1.25)
  assert model.stored["measured"] * model.stored["uniform"] == pytest.approx(
      0.007 * 0.008)
  # The prices read the new figures.
  ms = choice.candidate_ms
  assert ms["measured"] == pytest.approx(
      1e3 * (KERNELS["measured"] + model.stored["measured"]))
  assert ms["uniform"] < ms["measured"]


def test_without_kept_programs_nothing_is_timed_again(fake_programs):
  fake_programs.clear()   # figures read from the disk cache: no program
  model = _Model({"measured": 0.007, "uniform": 0.008})
  assert _choose(model).taken == "measured" and not model.stored
  model = _Model({"measured": 0.007, "uniform": 0.008})
  assert _choose(model, programs=None).taken == "measured"
  assert not model.stored


def test_only_calibrated_builds_time_again(fake_programs):
  del fake_programs
  model = _Model({"measured": 0.007, "uniform": 0.008})
  model.calibrated = False
  assert _choose(model).taken == "measured" and not model.stored


def _priced(name, seconds, extra_s=1e-4):
  return S.Priced(name, None, None, None, seconds, extra_s)


def test_close_candidates():
  a, b, c = _priced("a", 0.010), _priced("b", 0.014), _priced("c", 0.0149)
  assert CS.close_candidates([a, b, c]) == [a, b, c]      # within 50%
  assert CS.close_candidates([a, b, c], margin=0.45) == [a, b]
  assert CS.close_candidates([a, c], margin=0.2) == []    # one alone
  assert CS.close_candidates([a, _priced("d", 0.016)]) == []
  # A price estimated on another plan's figure has no stand-in to time.
  guessed = _priced("b", 0.011, extra_s=None)
  assert CS.close_candidates([a, guessed]) == []


def test_rounds_and_repeats_fit_the_budget():
  # Two 10 ms stand-ins: 50 samples each would fit 1 s; at most 35.
  assert CS.rounds_and_repeats(0.020) == (7, 5)
  rounds, repeats = CS.rounds_and_repeats(0.100)    # 10 samples fit
  assert rounds * repeats <= 10 and rounds >= 3
  # Slow stand-ins: never fewer than MIN_SAMPLES samples (3 rounds of 3).
  assert CS.rounds_and_repeats(2.0) == (3, 3)


def test_a_real_build_times_its_close_candidates_again(tmp_path, monkeypatch):
  monkeypatch.setattr(CS, "MARGIN", 1e9)      # every candidate is close
  fn, params, batch = _tiny(n=4, kinds=("embed", "layer", "head"))
  timed = []
  orig = CS._paired.paired_seconds

  def paired(samplers, old, **kw):
    timed.append(sorted(old))
    return orig(samplers, old, **kw)
  monkeypatch.setattr(CS._paired, "paired_seconds", paired)
  step = tj.schedule(fn, mesh=jax.make_mesh((2,), ("pipe",)),
                     placement=tj.Placement([(0, 1), 0, 1]),
                     num_microbatches=4, cost="calibrated",
                     cache_dir=str(tmp_path),
                     switches=Switches(coarse_grid=False))
  step.build(params, batch)
  priced = [n for n in step.report.candidate_ms]
  records = [json.loads(p.read_text())
             for p in tmp_path.glob("standin-*")]
  if timed:   # two distinct candidates, both timed: re-timed side by side
    assert timed == [["measured", "uniform"]]
    assert sum(bool(r.get("paired")) for r in records) == 2
  else:       # one schedule (the uniform one a twin): nothing to pair
    assert len(priced) <= 1 or len(set(step.report.candidate_ms.values())) == 1
    assert not any(r.get("paired") for r in records)
  # The kept stand-in programs are dropped with the build's timers.
  assert getattr(step, "choice_standins", None) is None
