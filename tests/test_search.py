"""Repetend search + completion: known optima, infeasibility, validity."""

from __future__ import annotations

import hypothesis
from hypothesis import strategies as st
import pytest

from tessel_jax.graph import Block, BlockGraph, Edge, make_graph
from tessel_jax import placements, validate
from tessel_jax.search import (InfeasibleScheduleError, min_memory_limit,
                               period_lower_bound, search_repetend)
from tessel_jax.schedule import Repetend, Schedule
from tessel_jax.search.budget import Budget
from tessel_jax.search.modulo_model import _decide_by_memory, solve_modulo
from tessel_jax.search.modulo_moves import (drop_idle_steps, moved_to_period,
                                            one_at_a_time)
from tessel_jax.search.modulo_solution import (ModuloSolution, normalise,
                                               pull_in, steady_peak)
from tessel_jax.search.period_search import descend
from tessel_jax.search.polish import shortest_latency
from tessel_jax.simulate import critical_path


def chain_vshape(num_devices: int, f: int = 1, b: int = 3) -> BlockGraph:
  """F0..F(D-1) on devices 0..D-1, then B(D-1)..B0 back (1F1B placement)."""
  blocks = [Block(i, "F", f, 1, (i,)) for i in range(num_devices)]
  blocks += [Block(2 * num_devices - 1 - i, "B", b, -1, (i,))
             for i in range(num_devices)]
  blocks.sort(key=lambda blk: blk.id)
  edges = [Edge(i, i + 1) for i in range(2 * num_devices - 1)]
  return BlockGraph(f"chain.d{num_devices}", num_devices, tuple(blocks),
                    tuple(edges))


def assert_valid_for(schedule, sizes):
  for n in sizes:
    unrolled = schedule.unroll(n)
    validate.assert_valid(unrolled)
    assert len(unrolled.actions) == n * schedule.graph.num_blocks


@pytest.mark.parametrize("devices", [2, 4, 8])
def test_1f1b_period_is_f_plus_b_at_memory_devices(devices):
  graph = chain_vshape(devices)
  schedule = search_repetend(graph, memory_limit=devices)
  assert schedule.period == 1 + 3
  assert schedule.status == "OPTIMAL"
  assert schedule.period_lower_bound == 4
  assert_valid_for(schedule, [1, 2, devices, 2 * devices + 3, 64])


def test_vshape_4_devices_128_microbatches_meets_lower_bound():
  schedule = search_repetend(chain_vshape(4), memory_limit=4)
  assert schedule.unroll(128).makespan == 524


def test_memory_one_runs_one_microbatch_at_a_time():
  graph = chain_vshape(4)
  schedule = search_repetend(graph, memory_limit=1)
  assert schedule.period == sum(b.span for b in graph.blocks)
  assert schedule.status == "OPTIMAL"
  assert max(schedule.unroll(5).peak_memory) == 1


def test_tighter_memory_gives_longer_period():
  graph = chain_vshape(4)
  periods = [search_repetend(graph, memory_limit=m, complete=False).period
             for m in (1, 2, 3, 4)]
  assert periods == sorted(periods, reverse=True)
  assert periods[-1] == 4 and periods[0] == 16


def test_infeasible_memory_names_smallest_working_limit():
  graph = chain_vshape(4)
  with pytest.raises(InfeasibleScheduleError, match="smallest limit that works"
                     " is 1") as info:
    search_repetend(graph, memory_limit=0)
  assert info.value.min_memory_limit == 1
  assert min_memory_limit(graph) == 1


def test_binding_limit_is_decided_by_the_lp_guided_stage():
  # mllm on 4 devices at limit 3 runs one micro-batch at a time (period 24,
  # every span in sequence). The interleaved portfolio cannot prove period
  # 23 infeasible in this budget; the LP-guided memory stage can.
  graph = placements.mllm(4)
  sol = solve_modulo(graph, 23, 3, time_limit_s=0.3)
  assert sol.status == "INFEASIBLE"
  found = solve_modulo(graph, 24, 3, time_limit_s=0.3)
  assert found.found and found.objective is None


def test_binding_limit_period_is_proven_optimal():
  schedule = search_repetend(placements.mllm(4), memory_limit=3,
                             time_limit_s=5, complete=False)
  assert schedule.period == 24
  assert schedule.status == "OPTIMAL"
  assert schedule.period_lower_bound == 24


def test_no_wrap_keeps_blocks_inside_period():
  graph = chain_vshape(4, f=2, b=3)
  schedule = search_repetend(graph, memory_limit=4, allow_wrap=False)
  rep = schedule.repetend
  for index, block in enumerate(graph.blocks):
    assert rep.phases[index] + block.span <= rep.period
  wrapped = search_repetend(graph, memory_limit=4)
  assert wrapped.period <= schedule.period
  assert_valid_for(schedule, [1, 3, 20])


def test_edge_delays_are_honoured():
  graph = chain_vshape(2).with_delays(2)
  schedule = search_repetend(graph, memory_limit=2)
  unrolled = schedule.unroll(10)
  validate.assert_valid(unrolled)
  starts = {(a.block, a.microbatch): a.start for a in unrolled.actions}
  # F0 ends at start+1, F1 on another device waits 2 more steps.
  assert starts[(1, 0)] >= starts[(0, 0)] + 1 + 2


def test_same_input_same_seed_gives_identical_json():
  graph = chain_vshape(4)
  first = search_repetend(graph, memory_limit=3, seed=7).unroll(16)
  second = search_repetend(graph, memory_limit=3, seed=7).unroll(16)
  assert (first.to_json(include_timing=False) ==
          second.to_json(include_timing=False))


def test_multi_device_block_shares_time_on_all_its_devices():
  # M-shape on 2 devices: E on both, F0, F1, B1, B0, then BE on both.
  graph = make_graph("m2", 2, [
      (0, "F", 1, 1, (0, 1)), (1, "F", 1, 1, (0,)), (2, "F", 1, 1, (1,)),
      (3, "B", 2, -1, (1,)), (4, "B", 2, -1, (0,)), (5, "B", 2, -1, (0, 1))],
      [(0, 1), (1, 2), (2, 3), (3, 4), (4, 5)])
  # Each device is busy 6 steps per micro-batch; 5 in flight reach it, 4 do
  # not (checked by hand: the all-device blocks pin both devices at once).
  schedule = search_repetend(graph, memory_limit=5)
  assert schedule.period == 1 + 1 + 2 + 2
  assert search_repetend(graph, memory_limit=4, complete=False).period == 7
  assert_valid_for(schedule, [1, 2, 7, 30])


# --- Random DAG placements: a valid schedule or the infeasibility error ----

@st.composite
def random_placements(draw):
  num_devices = draw(st.integers(1, 4))
  num_forward = draw(st.integers(num_devices, num_devices + 3))
  blocks, edges = [], []
  for i in range(num_forward):
    if i < num_devices:
      devices = (i,)
    else:
      devices = tuple(sorted(draw(st.sets(st.integers(0, num_devices - 1),
                                          min_size=1, max_size=num_devices))))
    mem = draw(st.integers(0, 2))
    blocks.append(Block(i, "F", draw(st.integers(1, 3)), mem, devices))
    blocks.append(Block(2 * num_forward - 1 - i, "B", draw(st.integers(1, 4)),
                        -mem, devices))
    for j in range(i):
      if draw(st.booleans()) or j == i - 1 and draw(st.booleans()):
        edges.append(Edge(j, i))
        edges.append(Edge(2 * num_forward - 1 - i, 2 * num_forward - 1 - j))
  # Every forward block precedes its own backward block.
  for i in range(num_forward):
    edges.append(Edge(i, 2 * num_forward - 1 - i))
  blocks.sort(key=lambda b: b.id)
  limit = draw(st.one_of(st.none(), st.integers(0, 6)))
  wrap = draw(st.booleans())
  return BlockGraph("random", num_devices, tuple(blocks), tuple(edges)), limit, wrap


@hypothesis.settings(max_examples=40, deadline=None)
@hypothesis.given(random_placements())
def test_random_dags_give_valid_schedule_or_infeasibility(case):
  graph, limit, wrap = case
  try:
    schedule = search_repetend(graph, memory_limit=limit, allow_wrap=wrap,
                               time_limit_s=20.0)
  except InfeasibleScheduleError as err:
    assert err.min_memory_limit is not None
    assert limit is not None and err.min_memory_limit > limit
    return
  assert schedule.period >= max(graph.device_load(d)
                                for d in range(graph.num_devices))
  k = schedule.repetend.max_offset
  for n in sorted({1, 2, k + 1, max(1, 2 * k), 2 * k + 3}):
    unrolled = schedule.unroll(n)
    assert not validate.check(unrolled), validate.check(unrolled)[:3]


@pytest.mark.parametrize("mode", ["train", "infer"])
@pytest.mark.parametrize("name", sorted(placements.PLACEMENTS))
def test_every_named_placement_gets_a_valid_schedule(name, mode):
  graph = placements.get(name, 2, mode=mode)
  # Twice one whole micro-batch's activations: feasible, and binding.
  one_microbatch = max(sum(b.memory for b in graph.blocks_on(d) if b.memory > 0)
                       for d in range(graph.num_devices))
  limit = None if mode == "infer" else 2 * one_microbatch
  schedule = search_repetend(graph, memory_limit=limit, time_limit_s=5.0)
  assert schedule.period >= period_lower_bound(graph)
  assert_valid_for(schedule, [1, 5, 2 * schedule.repetend.max_offset + 2])


@hypothesis.settings(max_examples=30, deadline=None)
@hypothesis.given(random_placements())
def test_pulled_in_offsets_keep_the_repetend_valid(case):
  graph, limit, wrap = case
  period = period_lower_bound(graph) + 2
  sol = solve_modulo(graph, period, limit, allow_wrap=wrap, time_limit_s=2.0)
  hypothesis.assume(sol.found)
  pulled = pull_in(graph, period, limit, sol)
  assert pulled.phases == sol.phases
  spans = [b.span for b in graph.blocks]
  assert (Repetend(period, pulled.offsets, pulled.phases).latency(spans) <=
          Repetend(period, sol.offsets, sol.phases).latency(spans))
  if limit is not None:
    assert steady_peak(graph, period, pulled.phases, pulled.offsets) <= limit
  rep = Repetend(period=period, offsets=normalise(pulled.offsets),
                 phases=pulled.phases)
  schedule = Schedule(graph=graph, repetend=rep, memory_limit=limit)
  for n in (1, 3, 2 * rep.max_offset + 3):
    validate.assert_valid(schedule.unroll(n))


def test_steady_peak_matches_the_unrolled_schedule():
  graph = chain_vshape(4)
  schedule = search_repetend(graph, memory_limit=3, complete=False,
                             list_alternative=False)
  rep = schedule.repetend
  assert steady_peak(graph, rep.period, rep.phases, rep.offsets) == max(
      schedule.unroll(64).peak_memory)


@hypothesis.settings(max_examples=30, deadline=None)
@hypothesis.given(random_placements(), st.integers(0, 2), st.integers(1, 6))
def test_dropping_idle_steps_keeps_the_repetend_valid(case, delay, slack):
  graph, limit, wrap = case
  graph = graph.with_delays(delay)
  period = period_lower_bound(graph) + slack
  sol = solve_modulo(graph, period, limit, allow_wrap=wrap, time_limit_s=2.0)
  hypothesis.assume(sol.found)
  shorter, dropped = drop_idle_steps(graph, period, sol)
  assert period_lower_bound(graph) <= shorter <= period
  if limit is not None:
    assert steady_peak(graph, shorter, dropped.phases, dropped.offsets) <= limit
  rep = Repetend(period=shorter, offsets=normalise(dropped.offsets),
                 phases=dropped.phases)
  if not wrap:
    assert all(r + b.span <= shorter
               for r, b in zip(rep.phases, graph.blocks))
  schedule = Schedule(graph=graph, repetend=rep, memory_limit=limit)
  for n in (1, 3, 2 * rep.max_offset + 3):
    validate.assert_valid(schedule.unroll(n))


def test_dropping_idle_steps_shortens_a_one_at_a_time_repetend():
  # 1F1B on 2 devices at period 12 with one micro-batch at a time: F0 F1 B1
  # B0 back to back take 8 steps, so the 4 idle steps go.
  graph = chain_vshape(2)
  rep = ModuloSolution("FEASIBLE", offsets=(0, 0, 0, 0), phases=(0, 1, 2, 5))
  shorter, dropped = drop_idle_steps(graph, 12, rep)
  assert shorter == 8
  assert dropped.phases == (0, 1, 2, 5)
  # With a delay of 2 on the edges between devices (F0 -> F1, B1 -> B0) the
  # idle steps inside those delays stay; the two between F1 and B1 (same
  # device, no delay) and the last one (after B0) go.
  spaced = ModuloSolution("FEASIBLE", offsets=(0, 0, 0, 0),
                          phases=(0, 3, 6, 11))
  assert drop_idle_steps(graph.with_delays(2), 15, spaced)[0] == 12


def test_bound_proven_before_any_solution_still_decides_the_limit():
  stopped = ModuloSolution("UNKNOWN", bound=5, work=0.1)
  assert _decide_by_memory(stopped, 4).status == "INFEASIBLE"
  assert _decide_by_memory(stopped, 5).status == "UNKNOWN"



def test_moved_to_period_keeps_starts_and_pins_the_first_block():
  graph = chain_vshape(4)
  period, one = one_at_a_time(graph)
  shifted = ModuloSolution("FEASIBLE",
                           offsets=tuple(k + 2 for k in one.offsets),
                           phases=one.phases)
  hint = moved_to_period(graph, period, shifted, 5)
  starts = [k * 5 + r for k, r in zip(hint.offsets, hint.phases)]
  assert starts == [k * period + r for k, r in zip(one.offsets, one.phases)]
  first = [b.id for b in graph.blocks].index(graph.topological_order()[0])
  assert hint.phases[first] == 0 and min(hint.offsets) >= 0


def test_one_at_a_time_holds_one_microbatch_and_fits_the_smallest_limit():
  graph = placements.xshape(4)
  period, one = one_at_a_time(graph)
  assert period == sum(b.span for b in graph.blocks)
  # Depth first finishes one V before the other: one activation per device.
  assert steady_peak(graph, period, one.phases, one.offsets) == 1
  rep = Repetend(period=period, offsets=one.offsets, phases=one.phases)
  validate.assert_valid(Schedule(graph=graph, repetend=rep,
                                 memory_limit=1).unroll(3))


def test_latency_rounds_double_while_they_improve():
  # F0 F1 B1 B0 at phases 0 1 2 5 of period 8: B0's offset sets the latency
  # (24, 16, 8). Rounds double their work while the latency falls and stop
  # at the first round that does not improve.
  graph = chain_vshape(2)
  phases = (0, 1, 2, 5)

  def rep(b0_offset, status="FEASIBLE"):
    return ModuloSolution(status, offsets=(0, 0, 0, b0_offset), phases=phases)

  answers = [rep(1), rep(0), rep(0)]
  works = []

  def solve(work, hint):
    works.append(work)
    return answers[len(works) - 1]

  best = shortest_latency(solve, lambda sol: sol, graph, 8, rep(2, "OPTIMAL"),
                           polish=8.0)
  assert best.offsets == (0, 0, 0, 0) and best.status == "FEASIBLE"
  assert works == [1.0, 2.0, 4.0]
  # A first round that does not improve is the only one; a start whose
  # latency no round reached is kept, marked FEASIBLE (not the feasibility
  # solve's status).
  works.clear()
  answers = [rep(2)]
  best = shortest_latency(solve, lambda sol: sol, graph, 8, rep(1, "OPTIMAL"),
                           polish=8.0)
  assert best.offsets == (0, 0, 0, 1) and best.status == "FEASIBLE"
  assert works == [1.0]


def test_latency_solves_get_their_round_work_not_the_budget_floor(
    monkeypatch):
  # nnshape, 4 devices, limit 4: the period search is cheap, so the first
  # latency round is the least polish (0.02 deterministic s for 20 blocks),
  # below the period budget's 0.05 s floor, and its solve gets exactly that.
  from tessel_jax.search import polish, prober
  limits = []
  real = prober.solve_modulo

  def spy(graph, period, memory_limit, **kw):
    if kw.get("objective") == "latency":
      limits.append(kw["time_limit_s"])
    return real(graph, period, memory_limit, **kw)

  monkeypatch.setattr(prober, "solve_modulo", spy)
  graph = placements.get("nnshape", 4)
  search_repetend(graph, memory_limit=4, complete=False,
                  list_alternative=False)
  least = polish._LEAST_POLISH_PER_BLOCK * graph.num_blocks
  assert least < 0.05
  assert limits and limits[0] == pytest.approx(least)


def test_a_latency_solve_starts_from_its_whole_hint():
  # The hint is given in full (order literals and the latency's ends too,
  # rotated onto the symmetry pin), so CP-SAT loads it as a solution: even
  # tiny solves return it or better. mllm, 4 devices, limit 12, P = 12:
  # from a pulled-in start of latency 72, 0.005 deterministic s reach 69
  # (offsets and phases alone: 72).
  graph = placements.get("mllm", 4)
  spans = [b.span for b in graph.blocks]
  start = pull_in(graph, 12, 12, solve_modulo(graph, 12, 12, time_limit_s=5))
  start_latency = Repetend(12, start.offsets, start.phases).latency(spans)
  assert start_latency == 72
  sol = solve_modulo(graph, 12, 12, objective="latency", hint=start,
                     time_limit_s=0.005)
  assert sol.found and sol.objective < start_latency
  for name, devices, limit, period in [("nnshape", 4, 4, 32),
                                       ("zbv", 4, 12, 10)]:
    graph = placements.get(name, devices)
    spans = [b.span for b in graph.blocks]
    start = pull_in(graph, period, limit,
                    solve_modulo(graph, period, limit, time_limit_s=5))
    sol = solve_modulo(graph, period, limit, objective="latency", hint=start,
                       time_limit_s=0.001)
    assert sol.found
    assert sol.objective <= Repetend(period, start.offsets,
                                     start.phases).latency(spans)


def test_latency_already_on_the_critical_path_is_not_polished():
  # F0 F1 B1 B0 back to back (phases 0 1 2 5, one offset): latency 8, the
  # critical path, so no latency solve runs and the latency is optimal.
  graph = chain_vshape(2)

  def solve(work, hint):
    raise AssertionError("a latency solve ran")

  start = ModuloSolution("OPTIMAL", offsets=(0, 0, 0, 0), phases=(0, 1, 2, 5))
  best = shortest_latency(solve, lambda sol: sol, graph, 8, start,
                           polish=8.0)
  assert best.offsets == start.offsets
  assert best.status == "OPTIMAL" and best.bound == critical_path(graph) == 8


def test_descent_probes_a_missed_period_again_only_as_the_decisive_one():
  # Repetends exist from 95 up; 90-94 are hard (never decided). The best
  # repetend comes down 100 -> 98 -> 95 while quick probes miss 92 and 93:
  # neither is probed twice, and 94, the decisive period, ends the descent.
  asked = []

  def solve(period, share, quick_stage_s, hint, descending):
    asked.append((period, share == 1 / 2))
    status = "FEASIBLE" if period >= 95 else "UNKNOWN"
    return ModuloSolution(status, offsets=(0,), phases=(0,), work=0.01)

  found, proven_low = descend(solve, Budget(30.0), (100, ModuloSolution(
      "FEASIBLE", offsets=(0,), phases=(0,))), 90, lambda f: f,
                              lambda f, p: None, 10, 0.01)
  assert found[0] == 95 and proven_low == 90
  quick = [p for p, decisive in asked if not decisive]
  assert len(quick) == len(set(quick)), asked
  assert asked[-1] == (94, True)


def test_near_or_past_the_wall_cap_polish_is_minimal_and_unroll_still_valid(
    monkeypatch):
  from tessel_jax.search import budget, polish
  polishes = []
  real = polish.shortest_latency

  def spy(solve, pull, graph, period, start, polish, **kw):
    polishes.append(polish)
    return real(solve, pull, graph, period, start, polish, **kw)

  monkeypatch.setattr(polish, "shortest_latency", spy)
  graph = placements.get("nnshape", 4)  # its search costs more than the floor
  search_repetend(graph, memory_limit=4, complete=False,
                  list_alternative=False)
  # Near the cap: the polish fits in the CPU time left (here next to none).
  with monkeypatch.context() as near:
    near.setattr(budget.Budget, "cap_left", lambda self: 1e-4)
    search_repetend(graph, memory_limit=4, complete=False,
                    list_alternative=False)
  monkeypatch.setattr(budget.Budget, "past_cap", lambda self: True)
  late = search_repetend(graph, memory_limit=4, list_alternative=False)
  assert polishes[1] == polishes[2] == pytest.approx(
      polish._LEAST_POLISH_PER_BLOCK * graph.num_blocks)
  assert polishes[0] > polishes[1]
  # No warmup/cooldown compaction then: unroll compacts the modulo schedule.
  assert not late.warmup and late.completer is None
  assert_valid_for(late, [1, 3, 2 * late.repetend.max_offset + 3])
