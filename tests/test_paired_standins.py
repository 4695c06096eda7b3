"""placement="auto": the close leaders' stand-ins timed again side by side
(``tessel_jax.paired_standins``). A fake sample timer: both stand-ins of a
turn share the machine's load (the turn's factor), so one stand-in timed
alone in an unlucky window is priced high, while the paired ratio of every
round is the true one."""

from __future__ import annotations

import random

import pytest

from tessel_jax import plans as P
from tessel_jax import paired_standins as PS


# Builds here price ticks with the microbenchmark's figures, not test them:
# measured once per worker and mesh (conftest.shared_tick_costs).
pytestmark = pytest.mark.usefixtures("shared_tick_costs")

V = P.Candidate("vshape", 2, 2, 8)
I = P.Candidate("interleaved", 2, 2, 8)
TRUE_S = {V: 0.010, I: 0.013}   # interleaved's stand-in costs 1.3x


def _plan(c, step, plan=None):
  if plan is not None:
    c = P.Candidate(c.placement, c.pipe, c.dp, c.microbatches, plan)
  return P.PricedPlan(candidate=c, step=step, unit="ms",
                      peak_bytes_per_device=(1000, 1000), source="tessel",
                      blocks=4, build_seconds=1.0)


def _windows():
  """Per stand-in a sample timer: the true seconds times the turn's load
  factor (0.75-1.25, the same for both stand-ins of a turn)."""
  rng = random.Random(3)
  state = {"factor": 1.0, "seen": set()}

  def window(c):
    def run():
      if not state["seen"] or c in state["seen"]:
        state["factor"], state["seen"] = rng.uniform(0.75, 1.25), set()
      state["seen"].add(c)
      return TRUE_S[c] * state["factor"]
    return run
  return {c: window(c) for c in (V, I)}


def test_unlucky_window_no_longer_flips_the_choice():
  # Priced on one window each: vshape's window was slow (x1.3), interleaved's
  # fast (x0.8), so interleaved's 1F1B is priced below vshape's.
  old = {V: TRUE_S[V] * 1.3, I: TRUE_S[I] * 0.8}
  plans = [_plan(V, 14.1), _plan(V, 14.0, "1f1b"), _plan(I, 13.2),
           _plan(I, 13.05, "1f1b")]
  assert P.choose_index(plans, None) == 3  # the old choice: interleaved
  assert PS.leaders(plans, None) == [I, V]
  new = PS.paired_seconds(_windows(), old)
  assert abs(new[I] / new[V] - 1.3) < 1e-6   # the true ratio
  assert abs(new[I] * new[V] - old[I] * old[V]) < 1e-12  # level kept
  again = PS.repriced(plans, old, new)
  assert again[P.choose_index(again, None)].candidate == P.Candidate(
      "vshape", 2, 2, 8, "1f1b")
  # Each plan moved by its stand-in's change.
  assert abs(again[0].step - (14.1 + (new[V] - old[V]) * 1e3)) < 1e-9
  assert abs(again[3].step - (13.05 + (new[I] - old[I]) * 1e3)) < 1e-9


def test_leaders_only_when_close_and_on_another_standin():
  far = [_plan(V, 10.0), _plan(I, 12.0)]       # 20% apart: not re-timed
  assert PS.leaders(far, None) == []
  same = [_plan(V, 10.0), _plan(V, 10.5, "1f1b"), _plan(I, 11.0)]
  assert PS.leaders(same, None) == [V, I]       # 1F1B shares vshape's
  over = [_plan(V, 10.0), _plan(I, 10.5)]
  assert PS.leaders(over, 500) == []            # nothing fits
  bound = [_plan(V, 10.0), P.PricedPlan(
      candidate=I, step=10.5, unit="ms", peak_bytes_per_device=(1,),
      source="tessel", blocks=4, build_seconds=1.0, bound=True)]
  assert PS.leaders(bound, None) == []          # no stand-in timed


def test_recheck_reprices_from_the_steps_and_remembers(monkeypatch):
  import types
  old = {V: TRUE_S[V] * 1.3, I: TRUE_S[I] * 0.8}

  def step(c):
    costs = types.SimpleNamespace(
        calibrated=True, _standin_seconds=lambda plan, mesh, axis, c=c: old[c])
    return types.SimpleNamespace(built=types.SimpleNamespace(plan=c),
                                 standin_program=object(), _costs=costs,
                                 mesh=None, pipe_axis="pipe")
  steps = {V: step(V), I: step(I)}
  windows = _windows()
  compiled = []

  def fake_sampler_of(s, params, batch):
    del params, batch
    compiled.append(s.built.plan)
    return windows[s.built.plan]
  monkeypatch.setattr(PS, "_sampler_of", fake_sampler_of)
  monkeypatch.setattr(PS, "_MEMO", {})
  plans = [_plan(V, 14.0, "1f1b"), _plan(I, 13.05, "1f1b")]
  again = PS.recheck(plans, steps, None, None, None, key="prog")
  assert again[P.choose_index(again, None)].candidate.placement == "vshape"
  assert sorted(c.placement for c in compiled) == ["interleaved", "vshape"]
  # The same program again in this process: no compile, same prices.
  assert PS.recheck(plans, steps, None, None, None, key="prog") == again
  assert len(compiled) == 2
  # A build that kept no stand-in program: prices unchanged.
  steps[V] = types.SimpleNamespace(built=None)
  assert PS.recheck(plans, steps, None, None, None, key="other") == plans


def test_a_build_keeps_its_compiled_standin_for_the_paired_timing(tmp_path):
  import jax
  import tessel_jax as tj
  from tessel_jax import placements
  from tessel_jax.cost import calibrate
  from test_cost import _tiny
  fn, params, batch = _tiny(n=4, kinds=("embed", "head"))
  step = tj.schedule(fn, mesh=jax.make_mesh((2,), ("pipe",)),
                     placement=placements.vshape(2), num_microbatches=4,
                     cost="calibrated", cache_dir=str(tmp_path))
  step.keep_standins = True   # FrontierFunction(paired_standins=True) sets it
  built = step.build(params, batch)
  plan = calibrate.standin_plan(built.plan)
  run = calibrate.kept_runner(step.standin_program, plan)
  assert run is not None      # no second compile for the paired timing
  jax.block_until_ready(run())
  # Without the flag nothing compiled is kept past the build.
  plain = tj.schedule(fn, mesh=jax.make_mesh((2,), ("pipe",)),
                      placement=placements.vshape(2), num_microbatches=4,
                      cost="calibrated", cache_dir=str(tmp_path))
  plain.build(params, batch)
  assert plain.standin_program is None
