"""Tests for tessel_jax.validate: clean schedules pass, faults are found."""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from chain_case import chain_graph as _chain_graph
from chain_case import random_placements as placements
from tessel_jax.graph import Block, BlockGraph, Edge, make_graph
from tessel_jax.schedule import (Action, UnrolledSchedule,
                                 schedule_in_device_order)
from tessel_jax.validate import (KINDS, ScheduleValidationError, Violation,
                                 assert_valid, check)

_SETTINGS = settings(max_examples=60, deadline=None,
                     suppress_health_check=[HealthCheck.too_slow])


# --- helpers -----------------------------------------------------------------


def _chain_schedule(limit: int | None = None) -> UnrolledSchedule:
  """Hand-timed valid schedule of ``_chain_graph`` for N=2 (makespan 9)."""
  actions = [Action(0, 0, 0), Action(1, 0, 1), Action(1, 1, 0),
             Action(2, 1, 1), Action(3, 2, 0), Action(5, 2, 1),
             Action(5, 3, 0), Action(7, 3, 1)]
  return UnrolledSchedule(graph=_chain_graph(), num_microbatches=2,
                          actions=tuple(sorted(actions)), memory_limit=limit)


def _with_actions(schedule: UnrolledSchedule, actions) -> UnrolledSchedule:
  return dataclasses.replace(schedule, actions=tuple(sorted(actions)))


def _move(schedule: UnrolledSchedule, block: int, mb: int,
          new_start: int) -> UnrolledSchedule:
  return _with_actions(schedule, [
      Action(new_start, a.block, a.microbatch)
      if (a.block, a.microbatch) == (block, mb) else a
      for a in schedule.actions])


def _kinds(violations: list[Violation]) -> set[str]:
  return {v.kind for v in violations}




def _device_order_schedule(graph: BlockGraph, n: int,
                           stride: int) -> UnrolledSchedule:
  """Valid schedule: priority ``topo_position + stride * mb`` per device."""
  topo = {b: i for i, b in enumerate(graph.topological_order())}
  seq = sorted((Action(0, b.id, m) for b in graph.blocks for m in range(n)),
               key=lambda a: (topo[a.block] + stride * a.microbatch,
                              a.microbatch))
  actions = schedule_in_device_order(graph, seq)
  return UnrolledSchedule(graph=graph, num_microbatches=n, actions=actions)


def _sequential_schedule(graph: BlockGraph, n: int) -> UnrolledSchedule:
  """Valid schedule with one action at a time (independent of schedule.py)."""
  gap = max((e.delay for e in graph.edges), default=0)
  t, actions = 0, []
  for m in range(n):
    for b in graph.topological_order():
      actions.append(Action(t, b, m))
      t += graph.block(b).span + gap
  return UnrolledSchedule(graph=graph, num_microbatches=n,
                          actions=tuple(actions))


@st.composite
def valid_schedules(draw) -> UnrolledSchedule:
  graph = draw(placements())
  n = draw(st.integers(1, 4))
  if draw(st.booleans()):
    return _device_order_schedule(graph, n, draw(st.integers(1, 4)))
  return _sequential_schedule(graph, n)


# --- hand-made cases ---------------------------------------------------------

def test_hand_schedule_is_clean():
  s = _chain_schedule(limit=2)
  assert check(s) == []
  assert_valid(s)


def test_dependency_violation_names_step_and_device():
  s = _move(_chain_schedule(), 3, 0, 4)  # B0.0 needs B1.0, which ends at 5
  vs = check(s)
  assert [v.kind for v in vs] == ["dependency"]
  v = vs[0]
  assert (v.step, v.device, v.block, v.microbatch) == (4, 0, 3, 0)
  assert "block 2" in v.message and "step 5" in v.message


def test_edge_delay_is_respected():
  g = _chain_graph(delay=1)
  s = dataclasses.replace(_chain_schedule(), graph=g)
  vs = check(s)
  # F1.0 at 1 needs F0.0 end 1 + 1; F1.1 at 2 needs 2 + 1; B0.0 at 5 needs
  # B1.0 end 5 + 1; B0.1 at 7 needs 7 + 1.
  assert {(v.kind, v.block, v.microbatch, v.step) for v in vs} == {
      ("dependency", 1, 0, 1), ("dependency", 1, 1, 2),
      ("dependency", 3, 0, 5), ("dependency", 3, 1, 7)}


def test_overlap_reports_the_device_and_both_blocks():
  s = _move(_chain_schedule(), 2, 1, 4)  # B1.1 at 4 while B1.0 runs [3, 5)
  vs = check(s)
  overlaps = [v for v in vs if v.kind == "overlap"]
  assert len(overlaps) == 1
  v = overlaps[0]
  assert (v.step, v.device, v.block, v.microbatch) == (4, 1, 2, 1)
  assert "block 2 of micro-batch 0" in v.message
  assert _kinds(vs) == {"overlap"}


def test_multi_device_overlap_reported_per_device():
  g = make_graph("mshape", 2, [(0, "F", 2, 0, (0, 1)), (1, "F", 1, 0, (0, 1))])
  s = UnrolledSchedule(graph=g, num_microbatches=1,
                       actions=(Action(0, 0, 0), Action(1, 1, 0)))
  vs = check(s)
  assert {(v.kind, v.step, v.device) for v in vs} == {
      ("overlap", 1, 0), ("overlap", 1, 1)}


def test_memory_limit_below_peak():
  s = _chain_schedule(limit=1)
  vs = check(s)
  assert {(v.kind, v.step, v.device, v.block, v.microbatch) for v in vs} == {
      ("memory", 1, 0, 0, 1), ("memory", 2, 1, 1, 1)}
  assert "memory is 2" in vs[0].message and "limit 1" in vs[0].message
  # Explicit limits override the schedule's; None skips the check.
  assert check(s, memory_limit=2) == []
  assert check(s, memory_limit=None) == []
  assert len(check(_chain_schedule(), memory_limit=1)) == 2


def test_order_violation():
  s = _move(_move(_chain_schedule(), 0, 0, 1), 0, 1, 0)  # swap F0.0 / F0.1
  vs = check(s)
  orders = [v for v in vs if v.kind == "order"]
  assert [(v.step, v.device, v.block, v.microbatch) for v in orders] == [
      (0, 0, 0, 1)]
  # Equal starts are an order violation too (and an overlap).
  vs = check(_move(_chain_schedule(), 0, 1, 0))
  assert {"order", "overlap"} <= _kinds(vs)


def test_missing_duplicate_unknown_out_of_range_negative():
  base = _chain_schedule()
  dropped = _with_actions(base, [a for a in base.actions
                                 if (a.block, a.microbatch) != (2, 1)])
  vs = check(dropped)
  assert [(v.kind, v.block, v.microbatch, v.step, v.device) for v in vs] == [
      ("missing", 2, 1, None, None)]

  dup = _with_actions(base, list(base.actions) + [Action(8, 3, 1)])
  vs = check(dup)
  assert [(v.kind, v.block, v.microbatch, v.step, v.device) for v in vs] == [
      ("extra", 3, 1, 8, 0)]

  unknown = _with_actions(base, list(base.actions) + [Action(9, 42, 0)])
  vs = check(unknown)
  assert [(v.kind, v.block, v.step, v.device) for v in vs] == [
      ("extra", 42, 9, None)]
  assert "[0, 1, 2, 3]" in vs[0].message

  out_of_range = _with_actions(base, list(base.actions) + [Action(9, 0, 2)])
  vs = check(out_of_range)
  assert [(v.kind, v.block, v.microbatch) for v in vs] == [("extra", 0, 2)]

  g = make_graph("one", 1, [(0, "F", 1, 0, (0,))])
  neg = UnrolledSchedule(graph=g, num_microbatches=2,
                         actions=(Action(-1, 0, 0), Action(0, 0, 1)))
  vs = check(neg)
  assert [(v.kind, v.step, v.device) for v in vs] == [
      ("negative_start", -1, 0)]


def test_every_violation_is_reported_and_grouped_by_kind():
  base = _chain_schedule(limit=1)
  actions = [a for a in base.actions if (a.block, a.microbatch) != (3, 1)]
  actions += [Action(0, 7, 0)]
  s = _move(_with_actions(base, actions), 3, 0, 4)
  vs = check(s)
  assert [v.kind for v in vs] == ["extra", "missing", "dependency",
                                  "memory", "memory"]
  assert [KINDS.index(v.kind) for v in vs] == sorted(
      KINDS.index(v.kind) for v in vs)


def test_assert_valid_message_lists_first_twenty():
  g = make_graph("one", 1, [(0, "F", 2, 0, (0,))])
  s = UnrolledSchedule(graph=g, num_microbatches=30,
                       actions=tuple(Action(m, 0, m) for m in range(30)))
  with pytest.raises(ScheduleValidationError) as info:
    assert_valid(s)
  err = info.value
  assert isinstance(err, ValueError)
  assert len(err.violations) == 29
  text = str(err)
  assert "29 violation(s)" in text and "and 9 more" in text
  assert text.count("[overlap]") == 20


# --- property tests ----------------------------------------------------------

@_SETTINGS
@given(valid_schedules())
def test_valid_schedules_check_clean(s):
  assert check(s) == []
  # At exactly the peak the memory check passes (peak from schedule.py, an
  # independent implementation).
  assert check(s, memory_limit=max(s.peak_memory)) == []


@_SETTINGS
@given(valid_schedules(), st.data())
def test_planted_dependency(s, data):
  edges = [e for e in s.graph.edges]
  e = data.draw(st.sampled_from(edges))
  m = data.draw(st.integers(0, s.num_microbatches - 1))
  src = next(a for a in s.actions if (a.block, a.microbatch) == (e.src, m))
  early = src.start + s.graph.block(e.src).span + e.delay - 1
  vs = check(_move(s, e.dst, m, early))
  assert any(v.kind == "dependency" and v.block == e.dst
             and v.microbatch == m and v.step == early
             and v.device == s.graph.block(e.dst).devices[0] for v in vs)


@_SETTINGS
@given(valid_schedules(), st.data())
def test_planted_overlap(s, data):
  pairs = [(a, b) for a in s.actions for b in s.actions
           if (a.block, a.microbatch) < (b.block, b.microbatch)
           and set(s.graph.block(a.block).devices)
           & set(s.graph.block(b.block).devices)]
  if not pairs:
    return
  a, b = data.draw(st.sampled_from(pairs))
  vs = check(_move(s, b.block, b.microbatch, a.start))
  shared = set(s.graph.block(a.block).devices) & set(
      s.graph.block(b.block).devices)
  found = {v.device for v in vs if v.kind == "overlap" and v.step == a.start}
  assert shared <= found


@_SETTINGS
@given(valid_schedules())
def test_planted_memory_limit(s):
  peak = s.peak_memory
  top = max(peak)
  if top <= 0:
    return
  vs = check(s, memory_limit=top - 1)
  assert vs and _kinds(vs) == {"memory"}
  assert {v.device for v in vs} == {d for d, p in enumerate(peak)
                                    if p == top}
  for v in vs:
    assert f"memory is {top}" in v.message
    # Only a step at which a block allocating memory starts can exceed.
    assert any(a.start == v.step and v.device in s.graph.block(a.block).devices
               and s.graph.block(a.block).memory > 0 for a in s.actions)


@_SETTINGS
@given(valid_schedules(), st.data())
def test_planted_order_swap(s, data):
  if s.num_microbatches < 2:
    return
  b = data.draw(st.sampled_from(s.graph.ids))
  m = data.draw(st.integers(0, s.num_microbatches - 2))
  t = {(a.block, a.microbatch): a.start for a in s.actions}
  swapped = _move(_move(s, b, m, t[(b, m + 1)]), b, m + 1, t[(b, m)])
  vs = check(swapped)
  assert any(v.kind == "order" and v.block == b and v.microbatch == m + 1
             and v.step == t[(b, m)]
             and v.device == s.graph.block(b).devices[0] for v in vs)


@_SETTINGS
@given(valid_schedules(), st.data())
def test_planted_missing_duplicate_unknown(s, data):
  victim = data.draw(st.sampled_from(s.actions))
  dropped = _with_actions(s, [a for a in s.actions if a != victim])
  assert [(v.kind, v.block, v.microbatch) for v in check(dropped)] == [
      ("missing", victim.block, victim.microbatch)]
  # A duplicate at the same step would also overlap, were it kept: it is not.
  dup = _with_actions(s, list(s.actions) + [victim])
  assert [(v.kind, v.block, v.microbatch, v.step) for v in check(dup)] == [
      ("extra", victim.block, victim.microbatch, victim.start)]
  unknown = _with_actions(s, list(s.actions) + [Action(0, 99, 0)])
  assert [(v.kind, v.block) for v in check(unknown)] == [("extra", 99)]
  beyond = _with_actions(
      s, list(s.actions) + [Action(victim.start, victim.block,
                                   s.num_microbatches)])
  assert [(v.kind, v.microbatch) for v in check(beyond)] == [
      ("extra", s.num_microbatches)]


# --- cross-check of the search (skipped where it is not importable) ----------

def _search_module():
  return pytest.importorskip("tessel_jax.search")


def test_searched_vshape_schedules_are_valid():
  search = _search_module()
  blocks = [Block(i, "F", 1, 1, (i,)) for i in range(4)]
  blocks += [Block(7 - i, "B", 3, -1, (i,)) for i in reversed(range(4))]
  g = BlockGraph(name="vshape.d4", num_devices=4, blocks=tuple(blocks),
                 edges=tuple(Edge(i, i + 1) for i in range(7)))
  for limit in (None, 2):
    plan = search.search_repetend(g, memory_limit=limit, time_limit_s=10.0)
    for n in (1, 3, 8, 32):
      u = plan.unroll(n)
      assert check(u) == [], (limit, n)
      if limit is not None and n > 1:
        assert {v.kind for v in check(u, memory_limit=limit - 1)} == {
            "memory"}


@settings(max_examples=15, deadline=None,
          suppress_health_check=[HealthCheck.too_slow])
@given(placements(), st.integers(1, 6), st.booleans())
def test_searched_random_schedules_are_valid(graph, n, limited):
  search = _search_module()
  limit = None
  if limited:  # one micro-batch at a time always fits this limit
    limit = max(sum(max(b.memory, 0) for b in graph.blocks_on(d))
                for d in range(graph.num_devices))
  plan = search.search_repetend(graph, memory_limit=limit, time_limit_s=5.0)
  assert check(plan.unroll(n)) == []
