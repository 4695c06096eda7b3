"""List scheduling of all N micro-batches, and its use by Schedule.unroll."""

from __future__ import annotations

import hypothesis
import pytest
from hypothesis import strategies as st

from chain_case import random_placements
from tessel_jax import placements, simulate, validate
from tessel_jax.graph import Block, BlockGraph, Edge
from tessel_jax.schedule import Action, UnrolledSchedule
from tessel_jax.search import list_improve as li
from tessel_jax.search import list_schedule as ls
from tessel_jax.search import search_repetend


def _unrolled(graph, n, actions, limit):
  return UnrolledSchedule(graph=graph, num_microbatches=n, actions=actions,
                          memory_limit=limit)


def test_tail_rule_without_limit_is_gpipe_optimal_on_vshape():
  graph = placements.vshape(4)  # F=1, B=3
  actions = ls.list_schedule(graph, 8, None, "tail")
  run = _unrolled(graph, 8, actions, None)
  validate.assert_valid(run)
  # GPipe: every forward first; the bound is met exactly.
  assert run.makespan == simulate.lower_bound_makespan(graph, 8)
  assert max(run.peak_memory) == 8


def test_memory_limit_is_honoured_or_none():
  graph = placements.vshape(4)
  actions = ls.list_schedule(graph, 16, 4, "microbatch")
  run = _unrolled(graph, 16, actions, 4)
  validate.assert_valid(run)
  assert max(run.peak_memory) <= 4


def _starts(graph, n, actions):
  """Start per action ``k = position * n + microbatch`` (list_improve's)."""
  starts = [0] * (graph.num_blocks * n)
  for a in actions:
    starts[graph.index(a.block) * n + a.microbatch] = a.start
  return starts


def _to_actions(graph, n, starts):
  return tuple(sorted(Action(t, graph.blocks[k // n].id, k % n)
                      for k, t in enumerate(starts)))


def _end(graph, actions):
  return max(a.start + graph.block(a.block).span for a in actions)


def test_wide_rule_meets_the_bound_on_nnshape():
  # Two all-device blocks per micro-batch: "tail" runs every chain before
  # any all-device block, so each one waits for the pipeline to drain;
  # "wide" runs them as soon as they are ready (a pause of every device,
  # no idle step). 35 is the optimum (CP-SAT) and the shared bound.
  graph = placements.nnshape(4, mode="infer")
  assert simulate.lower_bound_makespan_shared(graph, 8) == 35
  assert _end(graph, ls.list_schedule(graph, 8, 0, "tail")) == 38
  wide = ls.list_schedule(graph, 8, 0, "wide")
  validate.assert_valid(_unrolled(graph, 8, wide, 0))
  assert _end(graph, wide) == 35


def test_justification_strictly_helps_by_hand():
  # dev0: A (3); dev1: C (3), D (3); W (2) on both; A -> D, W -> C.
  # "tail" starts A first (tail 6 > 5): W waits for dev0 until 3, dev1
  # idles until 5 and C, D end at 11. Justified: W at 0, A and C at 2, D
  # at 5, end 8 = dev1's load (the bound).
  graph = BlockGraph("hand", 2, (
      Block(0, "F", 3, 0, (0,)), Block(1, "F", 2, 0, (0, 1)),
      Block(2, "F", 3, 0, (1,)), Block(3, "F", 3, 0, (1,))),
      (Edge(0, 3), Edge(1, 2)))
  greedy = ls.list_schedule(graph, 1, None, "tail")
  assert [(a.start, a.block) for a in greedy] == [(0, 0), (3, 1), (5, 2),
                                                  (8, 3)]
  better = li.improve(graph, 1, None, _starts(graph, 1, greedy))
  assert better == [2, 0, 2, 5]
  assert li.Instance(graph, 1).makespan(better) == 8
  assert _end(graph, ls.best_list_schedule(graph, 1, None)) == 8


@pytest.mark.parametrize("name, devices", [("zbv", 8), ("xshape", 8),
                                           ("nnshape", 8), ("interleaved", 4)])
def test_best_list_schedule_is_near_the_shared_bound(name, devices):
  graph = placements.get(name, devices)
  actions = ls.best_list_schedule(graph, 32, None)
  run = _unrolled(graph, 32, actions, None)
  validate.assert_valid(run)
  bound = simulate.lower_bound_makespan_shared(graph, 32)
  assert run.makespan <= 1.02 * bound
  plain = ls.best_list_schedule(graph, 32, None, improve=False)
  assert run.makespan <= _end(graph, plain)
  assert ls.best_list_schedule(graph, 32, None) == actions  # deterministic


def test_unknown_rule_names_the_choices():
  try:
    ls.list_schedule(placements.vshape(2), 2, None, "random")
  except ValueError as err:
    assert "tail" in str(err) and "microbatch" in str(err)
  else:
    raise AssertionError("no error")


@hypothesis.settings(max_examples=40, deadline=None)
@hypothesis.given(random_placements(), st.integers(1, 9),
                  st.sampled_from(ls.PRIORITIES), st.integers(0, 6))
def test_random_placements_valid_or_stuck(graph, n, rule, extra):
  limit = max([b.memory for b in graph.blocks] + [0]) + extra
  actions = ls.list_schedule(graph, n, limit, rule)
  if actions is None:
    return  # stuck on memory: allowed, the repetend is used then
  run = _unrolled(graph, n, actions, limit)
  validate.assert_valid(run)
  assert len(run.actions) == n * graph.num_blocks


@hypothesis.settings(max_examples=40, deadline=None)
@hypothesis.given(random_placements(), st.integers(1, 7),
                  st.sampled_from(ls.PRIORITIES),
                  st.one_of(st.none(), st.integers(0, 6)))
def test_improvement_is_valid_and_never_worse(graph, n, rule, extra):
  limit = (None if extra is None else
           max([b.memory for b in graph.blocks] + [0]) + extra)
  actions = ls.list_schedule(graph, n, limit, rule)
  if actions is None:
    return
  better = li.improve(graph, n, limit, _starts(graph, n, actions))
  inst = li.Instance(graph, n)
  assert inst.makespan(better) <= _end(graph, actions)
  run = _unrolled(graph, n, _to_actions(graph, n, better), limit)
  validate.assert_valid(run)
  best = ls.best_list_schedule(graph, n, limit)
  if best is not None:
    validate.assert_valid(_unrolled(graph, n, best, limit))
    if rule == "tail":  # best_list_schedule tries this one among others
      assert _end(graph, best) <= run.makespan


@hypothesis.settings(max_examples=30, deadline=None)
@hypothesis.given(random_placements(), st.integers(1, 7))
def test_backward_pass_is_valid_for_the_reversed_problem(graph, n):
  # Serial scheduling of the reversed graph in any precedence order,
  # read back in real time, is a valid schedule of the real graph.
  inst = li.Instance(graph, n, reverse=True)
  order = sorted(range(inst.size), key=lambda k: (k % n, k // n))
  order = _reverse_topological(graph, n, order)
  back = li.serial_schedule(inst, order, None)
  end = inst.makespan(back)
  actions = []
  for k, t in enumerate(back):
    i, j = divmod(k, n)
    actions.append(Action(end - t - inst.span[i], inst.ids[i], n - 1 - j))
  validate.assert_valid(_unrolled(graph, n, tuple(sorted(actions)), None))


def _reverse_topological(graph, n, order):
  """``order`` re-sorted by micro-batch, then reverse topological rank."""
  rank = {b: r for r, b in enumerate(reversed(graph.topological_order()))}
  pos = [rank[b.id] for b in graph.blocks]
  return sorted(order, key=lambda k: (k % n, pos[k // n]))


def test_unroll_keeps_the_shorter_of_repetend_and_list():
  graph = placements.alphafold(16)
  schedule = search_repetend(graph, None, time_limit_s=5)
  run = schedule.unroll(128)
  validate.assert_valid(run)
  periodic = search_repetend(graph, None, time_limit_s=5,
                             list_alternative=False).unroll(128)
  listed = ls.best_list_schedule(graph, 128, None)
  listed_end = _unrolled(graph, 128, listed, None).makespan
  assert run.makespan == min(periodic.makespan, listed_end)
  assert run.makespan < periodic.makespan  # alphafold: GPipe-like wins
  assert run.source == "tessel-list" and run.period is None


def test_unroll_picks_the_list_schedule_at_the_bound_on_nnshape():
  graph = placements.nnshape(4, mode="infer")
  run = search_repetend(graph, 0, time_limit_s=5).unroll(32)
  validate.assert_valid(run)
  periodic = search_repetend(graph, 0, time_limit_s=5,
                             list_alternative=False).unroll(32)
  assert run.makespan == simulate.lower_bound_makespan_shared(graph, 32)
  assert run.makespan < periodic.makespan
  assert run.source == "tessel-list"


def test_unroll_keeps_the_repetend_on_ties():
  graph = placements.vshape(4)
  run = search_repetend(graph, 4, time_limit_s=5).unroll(32)
  assert run.source == "tessel" and run.period == 4
