"""The rotation of a repetend with the shortest ramps (search.ramps), and
searches that start from a known repetend."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tessel_jax import checks, placements, validate
from tessel_jax.schedule import (Repetend, Schedule, UnrolledSchedule,
                                 modulo_actions)
from tessel_jax.search import (ramps, search_repetend,
                               smallest_memory_repetend)


@st.composite
def repetends(draw):
  graph = placements.get("vshape", 2)
  period = draw(st.integers(1, 12))
  n = graph.num_blocks
  offsets = draw(st.lists(st.integers(0, 3), min_size=n, max_size=n))
  phases = draw(st.lists(st.integers(0, period - 1), min_size=n, max_size=n))
  low = min(offsets)
  return graph, Repetend(period, tuple(k - low for k in offsets),
                         tuple(phases))


@settings(max_examples=60, deadline=None)
@given(repetends(), st.integers(0, 30))
def test_rotation_keeps_every_action_time(case, cut):
  graph, rep = case
  turned = ramps.rotate(rep, cut)
  assert min(turned.offsets) == 0
  assert all(0 <= r < rep.period for r in turned.phases)
  # Same steady state: every block's start moves by the same shift, the
  # cut (less whole periods from re-basing the offsets).
  shifts = {turned.start_in_microbatch_frame(i)
            - rep.start_in_microbatch_frame(i) for i in range(len(rep.phases))}
  assert len(shifts) == 1 and (shifts.pop() + cut) % rep.period == 0
  n = 6
  actions = lambda r: sorted(  # noqa: E731
      (a.block, a.microbatch, a.start - min(
          x.start for x in modulo_actions(Schedule(graph, r), n)))
      for a in modulo_actions(Schedule(graph, r), n))
  assert actions(turned) == actions(rep)


def test_cut_points_start_with_the_search_cut_and_are_distinct():
  rep = Repetend(10, (0, 1, 0, 2), (3, 0, 7, 3))
  cuts = ramps.cut_points(rep)
  assert cuts[0] == 0 and sorted(cuts) == [0, 3, 7]
  assert ramps.rotate(rep, 0) == rep
  sizes = [ramps.ramp_size(ramps.rotate(rep, c)) for c in cuts[1:]]
  assert sizes == sorted(sizes)
  assert ramps.cut_points(rep, max_ramp_actions=min(sizes) - 1) == [0]


def test_a_later_cut_shortens_mllm_at_a_middle_limit():
  """mllm, 4 devices, limit 5: the search's own cut unrolls to 2183 steps
  at N = 128 (its ramps compacted optimally); another cut to 2181."""
  graph = placements.get("mllm", 4)
  schedule = search_repetend(graph, 5, time_limit_s=10,
                             list_alternative=False)
  assert schedule.period == 17
  unrolled = schedule.unroll(128)
  validate.assert_valid(unrolled)
  assert max(unrolled.peak_memory) <= 5
  assert unrolled.makespan <= 2181


def test_best_rotation_never_worse_than_the_first_cut():
  graph = placements.get("xshape", 4)
  schedule = search_repetend(graph, 2, time_limit_s=5,
                             list_alternative=False)
  n = ramps.reference_microbatches(schedule.repetend)
  one = ramps.best_rotation(schedule, per_cut_s=0.05, max_cuts=1)
  many = ramps.best_rotation(schedule, per_cut_s=0.05, max_cuts=8)
  span = [ramps.makespan(ramps.with_templates(schedule, *r), n)
          for r in (one, many)]
  assert span[1] <= span[0]
  validate.assert_valid(
      ramps.with_templates(schedule, *many).unroll(n))


def test_search_from_a_known_repetend_proves_its_period_at_once():
  graph = placements.get("kshape", 4)
  fastest = search_repetend(graph, None, complete=False,
                            list_alternative=False, time_limit_s=5).period
  limit, _, witness = smallest_memory_repetend(graph, fastest,
                                               time_limit_s=5)
  assert witness is not None and witness.period == fastest
  schedule = search_repetend(graph, limit, time_limit_s=5, start=witness)
  assert schedule.period == fastest and schedule.status == "OPTIMAL"
  unrolled = schedule.unroll(32)
  validate.assert_valid(unrolled)
  assert max(unrolled.peak_memory) <= limit


@pytest.mark.parametrize("bad,words", [
    ("not a repetend", "expected a tessel_jax Repetend"),
    (Repetend(10, (0,), (0,)), "not a repetend of"),
    (Repetend(10, (0,) * 10, (0,) * 10), "breaks the rules"),
])
def test_bad_start_is_refused_with_a_reason(bad, words):
  graph = placements.get("kshape", 4)
  with pytest.raises(checks.InputError, match=words):
    search_repetend(graph, 8, time_limit_s=1, start=bad)


def test_start_over_the_limit_is_refused():
  graph = placements.get("kshape", 4)
  one = search_repetend(graph, None, complete=False,
                        list_alternative=False, time_limit_s=5)
  with pytest.raises(checks.InputError, match="exceeds the memory limit"):
    search_repetend(graph, 1, time_limit_s=1, start=one.repetend)


def test_search_from_a_known_repetend_is_never_longer_than_from_scratch(
    monkeypatch, no_clock_caps):
  """From a ``start`` at the smallest period the search also polishes and
  composes the repetend of its first probe from scratch, and keeps the
  shorter unrolling (here the start's is made longer: its ramps are left
  uncompacted). No wall-clock cut-offs (``no_clock_caps``): on a loaded
  machine they would change the result."""
  from tessel_jax.search import compose
  graph = placements.get("xshape", 4)
  fastest = search_repetend(graph, None, complete=False,
                            list_alternative=False, time_limit_s=5).period
  limit, _, witness = smallest_memory_repetend(graph, fastest,
                                               time_limit_s=5)
  built = []
  real = compose.finished

  def spy(solve, found, proven_low, polish, period_seconds, complete):
    if not built:  # the start's schedule: no ramps compacted
      complete = False
    built.append(real(solve, found, proven_low, polish, period_seconds,
                      complete))
    return built[-1]

  monkeypatch.setattr(compose, "finished", spy)
  schedule = search_repetend(graph, limit, time_limit_s=5, start=witness,
                             list_alternative=False)
  assert len(built) == 2  # the start's repetend and the first probe's
  assert built[0].repetend.period == built[1].repetend.period == fastest
  n = max(ramps.reference_microbatches(s.repetend) for s in built)
  spans = [ramps.makespan(s, n) for s in built]
  assert spans[1] < spans[0]
  assert ramps.makespan(schedule, n) == spans[1]
  monkeypatch.setattr(compose, "finished", real)
  scratch = search_repetend(graph, limit, time_limit_s=5,
                            list_alternative=False)
  assert ramps.makespan(schedule, n) <= ramps.makespan(scratch, n)
  validate.assert_valid(schedule.unroll(n))


def test_completion_too_large_for_the_memory_rule_pulls_the_modulo_in(
    monkeypatch):
  """Above ``completion.MAX_RESERVOIR_PAIRS`` no CP-SAT model is built (it
  took 15 GiB for nnshape on 32 devices at N = 128): the modulo schedule,
  pulled in, still valid under the limit."""
  from tessel_jax.search import completion

  def no_solve(*_, **__):
    raise AssertionError("CP-SAT must not run")

  graph = placements.get("mllm", 4)
  schedule = search_repetend(graph, 5, time_limit_s=5,
                             list_alternative=False)
  n = 6
  monkeypatch.setattr(completion, "MAX_RESERVOIR_PAIRS", 0)
  monkeypatch.setattr(completion._ActionModel, "solve", no_solve)
  actions = completion.complete_all(graph, schedule.repetend, n, 5)
  unrolled = UnrolledSchedule(graph=graph, num_microbatches=n,
                              actions=tuple(sorted(actions)), memory_limit=5)
  validate.assert_valid(unrolled)
  with pytest.raises(completion.CompletionError, match="too large"):
    completion.complete_all(graph, schedule.repetend, n, 1)


class _ScratchProber:
  """A stand-in for the period search's solves (``prober.Prober``) on
  nnshape, 4 devices, no limit: the first probe at the smallest period
  finds nothing; every later solve at or above it finds a repetend, at the
  smallest period only from ``found_low_after`` on (None: never)."""

  def __init__(self, found_low_after):
    from tessel_jax.search.budget import Budget  # pylint: disable=import-outside-toplevel
    from tessel_jax.search.period_bounds import period_lower_bound  # pylint: disable=import-outside-toplevel
    self.graph = placements.get("nnshape", 4)
    self.memory_limit, self.solve_kw, self.tried = None, {}, set()
    self.budget = Budget(30.0)
    self.low = period_lower_bound(self.graph)
    self.asked = []
    self.found_low_after = found_low_after

  def __call__(self, period, share=1.0, descending=False, seconds=None,
               **kw):
    from tessel_jax.search.modulo_solution import ModuloSolution  # pylint: disable=import-outside-toplevel
    self.asked.append(period)
    self.tried.add(period)
    self.budget.spend(0.01)
    n = self.graph.num_blocks
    low_ok = (self.found_low_after is not None
              and len(self.asked) > self.found_low_after)
    if period > self.low or low_ok:
      return ModuloSolution("FEASIBLE", offsets=(0,) * n, phases=(0,) * n,
                            work=0.01)
    return ModuloSolution("UNKNOWN", work=0.01)

  def shorten(self, found):
    return found

  def hint_at(self, found, period):
    return None


def test_a_start_also_gets_the_rest_of_the_search_from_scratch():
  """Beside a ``start`` repetend at the smallest period, the period search
  from scratch goes on past a first probe that finds nothing (galloping up,
  descending) and its repetend at that period is offered for composing;
  where it ends above that period, nothing is."""
  from tessel_jax.search import compose  # pylint: disable=import-outside-toplevel
  solve = _ScratchProber(found_low_after=1)
  found = compose._scratch_at_low(solve)
  assert found is not None and found[0] == solve.low
  assert solve.asked[0] == solve.low and len(solve.asked) > 2
  never = _ScratchProber(found_low_after=None)
  assert compose._scratch_at_low(never) is None
  assert never.asked.count(never.low) >= 2  # the first and decisive probes


def test_longer_ramp_solves_never_end_later_than_the_modulo_pulled_in():
  """The ramps' CP-SAT models start from the modulo schedule pulled in
  (``completion``), so more time never ends later. nnshape (Tessel's), 8
  devices, limit 20, without wrap-around, the repetend the search found
  before its latency polish got 0.1 s (latency 111): from the plain modulo
  hint, 0.5 s per ramp unrolled N = 30 to 293 steps, 0.025 s to 271."""
  from experiments import tessel_cases
  from tessel_jax.search import completion
  graph = tessel_cases.get("nnshape", 8)
  rep = Repetend(8, (0, 0, 1, 2, 2, 2, 3, 4, 5, 6, 6, 7, 8, 9, 9, 10, 11,
                     12, 13, 13),
                 (0, 1, 1, 1, 4, 5, 1, 1, 1, 1, 2, 2, 2, 2, 7, 1, 2, 2, 2, 6))
  schedule = Schedule(graph=graph, repetend=rep, memory_limit=20)
  n = ramps.reference_microbatches(rep)
  spans = []
  for seconds in (0.05, 1.0):
    templates = completion.compact_templates(graph, rep, 20,
                                             time_limit_s=seconds)
    unrolled = ramps.with_templates(schedule, rep, templates).unroll(n)
    validate.assert_valid(unrolled, memory_limit=20)
    spans.append(unrolled.makespan)
  assert spans[1] <= spans[0] <= 271


def test_cuts_with_larger_ramps_than_an_unsolved_one_are_pulled_in(
    monkeypatch):
  """Once CP-SAT found nothing for a cut's ramps (``MODULO``), the cuts
  whose ramps are at least as large get the modulo schedule pulled in
  without a solve; smaller ones are still solved."""
  from tessel_jax.search import completion
  graph = placements.get("nnshape", 4)
  schedule = search_repetend(graph, 4, time_limit_s=2, complete=False,
                             list_alternative=False)
  real, calls = completion.compact_templates, []

  def first_unsolved(graph, rep, limit, **kw):
    templates = real(graph, rep, limit, **kw)
    calls.append((ramps.ramp_size(rep), kw.get("solve")))
    if len(calls) == 1:  # as if CP-SAT's time ran out in its presolve
      templates = completion.Templates(templates.warmup,
                                       templates.steady_start,
                                       templates.cooldown, "MODULO")
    return templates

  monkeypatch.setattr(completion, "compact_templates", first_unsolved)
  rep, templates = ramps.best_rotation(schedule, per_cut_s=0.05, max_cuts=16)
  first = calls[0][0]
  assert calls[0][1] is True and len(calls) > 4
  assert [solve for _, solve in calls[1:]] == [
      size < first for size, _ in calls[1:]]
  assert any(size < first for size, _ in calls[1:])
  assert any(size >= first for size, _ in calls[1:])
  validate.assert_valid(ramps.with_templates(schedule, rep, templates).unroll(
      ramps.reference_microbatches(rep)), memory_limit=4)


def test_ramps_without_a_solve_are_the_modulo_schedule_pulled_in(
    monkeypatch):
  from tessel_jax.search import completion

  def no_solver(*args, **kw):
    raise AssertionError("no CP-SAT solve expected")

  graph = placements.get("nnshape", 4)
  schedule = search_repetend(graph, 4, time_limit_s=2, complete=False,
                             list_alternative=False)
  monkeypatch.setattr(completion, "make_solver", no_solver)
  templates = completion.compact_templates(graph, schedule.repetend, 4,
                                           solve=False)
  assert templates.status == "MODULO"
  rep = schedule.repetend
  unrolled = ramps.with_templates(schedule, rep, templates).unroll(
      ramps.reference_microbatches(rep))
  validate.assert_valid(unrolled, memory_limit=4)
  # No longer than the modulo schedule compacted whole (no templates).
  plain = Schedule(graph=graph, repetend=rep, memory_limit=4).unroll(
      ramps.reference_microbatches(rep))
  assert unrolled.makespan <= plain.makespan


def test_the_ramps_of_every_latency_round_are_compared():
  """xshape, 4 devices, limit 5 (P = 8): the latency polish's second round
  shortens the latency but its ramps unroll N = 128 one step longer than
  the first round's (1030 against 1029); both are compacted and the
  shorter kept."""
  from tessel_jax import simulate
  graph = placements.get("xshape", 4)
  schedule = search_repetend(graph, 5, time_limit_s=10,
                             list_alternative=False)
  unrolled = schedule.unroll(128)
  validate.assert_valid(unrolled, memory_limit=5)
  assert unrolled.makespan <= 1029
  spans = [b.span for b in graph.blocks]
  assert schedule.repetend.latency(spans) > simulate.critical_path(graph)


def test_refined_ramps_are_never_longer_and_stay_valid():
  # ``ramps.refined``: the best cut compacted once more with more time is
  # kept only where it unrolls shorter.
  graph = placements.get("xshape", 4)
  schedule = search_repetend(graph, 2, time_limit_s=5, complete=False,
                             list_alternative=False)
  n = ramps.reference_microbatches(schedule.repetend)
  plain = ramps.best_rotation(schedule, per_cut_s=0.05, max_cuts=4)
  more = ramps.best_rotation(schedule, per_cut_s=0.05, max_cuts=4,
                             refine_s=0.2)
  span = [ramps.makespan(ramps.with_templates(schedule, *r), n)
          for r in (plain, more)]
  assert span[1] <= span[0]
  validate.assert_valid(ramps.with_templates(schedule, *more).unroll(n),
                        memory_limit=2)
