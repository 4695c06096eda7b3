"""Small-N unrolling as placement="auto" uses it (N = 4 or 8 per pipeline):
the makespan lower bound ends the work early, with the same schedules."""

from __future__ import annotations

import dataclasses
import types

import pytest

from tessel_jax import checks, placements, simulate, step_schedule, validate
from tessel_jax.hand_placement import SPANS
from tessel_jax.schedule import (SPLIT_MICROBATCHES, Schedule,
                                 UnrolledSchedule, concatenate)
from tessel_jax.search import completion, search_repetend


def _uniform(name, devices):
  graph = placements.get(name, devices)
  return dataclasses.replace(graph, blocks=tuple(
      dataclasses.replace(b, span=SPANS[b.kind]) for b in graph.blocks))


def _no_solve(*_, **__):
  raise AssertionError("CP-SAT must not run")


def test_completion_at_the_bound_needs_no_solve(monkeypatch):
  graph = _uniform("vshape", 4)
  rep = search_repetend(graph, time_limit_s=1, list_alternative=False
                        ).repetend
  monkeypatch.setattr(completion._ActionModel, "solve", _no_solve)
  for n in (1, 2, 3):
    actions = completion.complete_all(graph, rep, n, None)
    run = UnrolledSchedule(graph=graph, num_microbatches=n,
                           actions=tuple(sorted(actions)))
    validate.assert_valid(run)
    assert run.makespan == simulate.lower_bound_makespan_shared(graph, n)
  with pytest.raises(AssertionError, match="must not run"):   # as before
    completion.complete_all(graph, rep, 3, None, use_bound=False)


def test_completion_above_the_bound_still_solves_and_fits():
  graph = _uniform("mllm", 4)
  sched = search_repetend(graph, 3, time_limit_s=1, list_alternative=False)
  for n in (2, 3):
    actions = completion.complete_all(graph, sched.repetend, n, 3,
                                      time_limit_s=1)
    run = UnrolledSchedule(graph=graph, num_microbatches=n,
                           actions=tuple(sorted(actions)), memory_limit=3)
    validate.assert_valid(run)
    old = completion.complete_all(graph, sched.repetend, n, 3,
                                  time_limit_s=1, use_bound=False)
    assert run.makespan <= UnrolledSchedule(
        graph=graph, num_microbatches=n, actions=tuple(sorted(old)),
        memory_limit=3).makespan


def test_a_wrong_bound_falls_back_to_the_plain_solve(monkeypatch):
  graph = _uniform("vshape", 2)
  rep = search_repetend(graph, time_limit_s=1, list_alternative=False
                        ).repetend
  monkeypatch.setattr(simulate, "lower_bound_makespan_shared",
                      lambda g, n: 10**6)   # no schedule reaches it
  monkeypatch.setattr(completion._ActionModel, "compacted_hint",
                      lambda self, limit: None)
  actions = completion.complete_all(graph, rep, 3, None, time_limit_s=1)
  validate.assert_valid(UnrolledSchedule(graph=graph, num_microbatches=3,
                                         actions=tuple(sorted(actions))))


def test_unroll_at_the_bound_tries_no_split(monkeypatch):
  graph = _uniform("vshape", 4)
  sched = search_repetend(graph, time_limit_s=1)
  seen = []
  once = Schedule._unroll_once

  def record(self, n):
    seen.append(n)
    return once(self, n)
  monkeypatch.setattr(Schedule, "_unroll_once", record)
  run = sched.unroll(8)
  assert run.makespan == simulate.lower_bound_makespan_shared(graph, 8)
  assert seen == [8]   # before: unroll(1) .. unroll(7) for the splits too
  for a in range(1, 8):   # and still never longer than a split
    assert run.makespan <= concatenate(sched.unroll(a),
                                       sched.unroll(8 - a)).makespan


def _completion_limits(monkeypatch):
  seen = []
  real = completion.complete_all

  def record(*args, time_limit_s, **kw):
    seen.append(time_limit_s)
    return real(*args, time_limit_s=time_limit_s, **kw)
  monkeypatch.setattr(completion, "complete_all", record)
  return seen


@pytest.mark.parametrize("given", [None, 0.05])
def test_completion_time_limit_reaches_every_small_n_solve(
    monkeypatch, no_clock_caps, given):   # pylint: disable=unused-argument
  # Without no_clock_caps a loaded CI worker ran past the search's CPU cap
  # before the polish: no templates, no completer, nothing recorded.
  graph = _uniform("mllm", 4)
  seen = _completion_limits(monkeypatch)
  sched = search_repetend(graph, time_limit_s=1, list_alternative=False,
                          completion_time_s=given)
  for n in range(1, 9):
    validate.assert_valid(sched.unroll(n))
  assert seen   # mllm 4 completes N below its templates
  if given is None:
    assert min(seen) >= 1.0   # the default: at least 1 s per completion
  else:
    assert set(seen) == {given}


def test_completion_time_limit_is_checked():
  with pytest.raises(checks.InputError, match="completion_time_s"):
    search_repetend(_uniform("vshape", 2), time_limit_s=1,
                    completion_time_s=0)


def test_screening_builds_share_their_budget_with_the_completions():
  cheap = types.SimpleNamespace(cheap_screening=True, solver_time_limit_s=1.0)
  full = types.SimpleNamespace(cheap_screening=False, solver_time_limit_s=5.0)
  assert step_schedule.completion_time_s(cheap) == pytest.approx(
      1.0 / SPLIT_MICROBATCHES)
  assert step_schedule.completion_time_s(full) is None
  assert step_schedule.completion_time_s(object()) is None
