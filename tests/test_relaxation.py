"""The relaxation to a few devices: its subgraph and the proofs it makes."""

from __future__ import annotations

import itertools

import hypothesis
from hypothesis import strategies as st

from tessel_jax import placements
from tessel_jax.search import search_repetend
from tessel_jax.search.modulo_model import solve_modulo
from tessel_jax.search.modulo_solution import ModuloSolution, steady_peak
from tessel_jax.search.relaxation import (Relaxation, device_subgraph,
                                         relaxations)
from tessel_jax.search.period_bounds import period_lower_bound
from tessel_jax.schedule import Repetend

from test_search import random_placements


def test_subgraph_of_vshape_ends_keeps_the_longest_paths():
  # F0 F1 F2 F3 B3 B2 B1 B0 on 4 devices (F = 1, B = 3), kept on 0 and 3:
  # F0 -> F3 is 3 steps start to start (delay 2 after F0's one step),
  # B3 -> B0 is 9 (delay 6 after B3's three); F0 -> B0 is implied by F3.
  graph = placements.get("vshape", 4)
  sub = device_subgraph(graph, (0, 3))
  by_name = {b.name: b for b in sub.blocks}
  assert sorted(by_name) == ["B0", "B3", "F0", "F3"]
  assert by_name["F3"].devices == (1,) and by_name["B0"].devices == (0,)
  ids = {b.id: b.name for b in sub.blocks}
  edges = {(ids[e.src], ids[e.dst]): e.delay for e in sub.edges}
  assert edges == {("F0", "F3"): 2, ("F3", "B3"): 0, ("B3", "B0"): 6}


def test_all_device_block_keeps_only_the_chosen_devices():
  graph = placements.get("mllm", 4)
  sub = device_subgraph(graph, (0, 3))
  shared = [b for b in sub.blocks if len(b.devices) > 1]
  assert shared and all(b.devices == (0, 1) for b in shared)
  assert sub.num_devices == 2


def _restricted_repetend_is_valid(graph, sub, period, sol, limit):
  """The full repetend's kept blocks form a repetend of the subgraph."""
  kept = [graph.index(b.id) for b in sub.blocks]
  rep = Repetend(period, tuple(sol.offsets[i] for i in kept),
                 tuple(sol.phases[i] for i in kept))
  start = {b.id: rep.start_in_microbatch_frame(i)
           for i, b in enumerate(sub.blocks)}
  for e in sub.edges:
    assert start[e.dst] >= start[e.src] + sub.block(e.src).span + e.delay
  if limit is not None:
    assert steady_peak(sub, period, rep.phases, rep.offsets) <= limit


@hypothesis.settings(max_examples=40, deadline=None, suppress_health_check=[
    hypothesis.HealthCheck.filter_too_much])
@hypothesis.given(random_placements(), st.integers(0, 2), st.integers(0, 6))
@hypothesis.example(  # without wrap-around, pinned at its first block's
    # phase, the subgraph on devices 1 and 2 "proved" P = 3 infeasible
    case=(placements.BlockGraph(
        name="random", num_devices=3,
        blocks=(placements.Block(0, "F", 1, 0, (0,)),
                placements.Block(1, "F", 1, 1, (1,)),
                placements.Block(2, "F", 1, 0, (2,)),
                placements.Block(3, "B", 2, 0, (2,)),
                placements.Block(4, "B", 2, -1, (1,)),
                placements.Block(5, "B", 1, 0, (0,))),
        edges=(placements.Edge(1, 2, 0), placements.Edge(3, 4, 0),
               placements.Edge(0, 5, 0), placements.Edge(1, 4, 0),
               placements.Edge(2, 3, 0))), None, False),
    delay=0, slack=0)
def test_relaxation_never_rules_out_a_period_the_placement_reaches(
    case, delay, slack):
  graph, limit, wrap = case
  limit = 2 if limit is None else limit  # relaxations need a limit
  graph = graph.with_delays(delay)
  period = period_lower_bound(graph) + slack
  sol = solve_modulo(graph, period, limit, allow_wrap=wrap, time_limit_s=2.0)
  hypothesis.assume(sol.found)
  devices = range(graph.num_devices)
  for kept in itertools.chain(itertools.combinations(devices, 1),
                              itertools.combinations(devices, 2)):
    subgraph = Relaxation(graph, limit, kept=kept, allow_wrap=wrap)
    _restricted_repetend_is_valid(graph, subgraph.model_graph, period, sol,
                                  limit)
    for relaxation in (subgraph, Relaxation(graph, limit, kept=kept,
                                            pooled=True, allow_wrap=wrap)):
      proven, _ = relaxation.proves_infeasible(period, time_limit_s=2.0)
      assert not proven, (kept, relaxation.pooled, period)


def test_relaxation_proves_the_tight_xshape_period():
  # One activation per device: 26 is the optimum at 4 devices; the two end
  # devices alone rule out 25, and so every smaller period.
  graph = placements.get("xshape", 4)
  relaxed = relaxations(graph, 1)
  assert [r.pooled for r in relaxed] == [False]  # no block spans 0 and 1
  relaxation = relaxed[0]
  assert relaxation.model_graph.num_blocks == 8
  assert relaxation.proves_infeasible(25, time_limit_s=5.0)[0]
  assert relaxation.proves_infeasible(20, time_limit_s=5.0) == (True, 0.0)
  assert not relaxation.proves_infeasible(26, time_limit_s=5.0)[0]
  schedule = search_repetend(graph, memory_limit=1, time_limit_s=10.0,
                             complete=False, list_alternative=False)
  assert schedule.period == 26 and schedule.status == "OPTIMAL"


def test_pooled_relaxation_sees_the_block_on_all_devices():
  # finetune, one activation per device: the chain F1..F4 B4..B1 fills 12
  # steps back to back, so the first block, on all devices, needs a 13th.
  # Devices 0 and 3 alone miss that; pooling devices 1 and 2 keeps it.
  graph = placements.get("finetune", 4)
  subgraph, pooled = relaxations(graph, 1)
  assert pooled.pooled and pooled.model_graph is graph
  assert not subgraph.proves_infeasible(12, time_limit_s=5.0)[0]
  assert pooled.proves_infeasible(12, time_limit_s=5.0)[0]
  assert not pooled.proves_infeasible(13, time_limit_s=5.0)[0]


def test_relaxation_retries_a_proof_only_with_a_larger_budget(monkeypatch):
  # A proof that ran out of budget is not run again at or above its period
  # with no more budget; the decisive probe's larger budget runs it again.
  # A relaxed repetend stops every try at or above its period.
  from tessel_jax.search import relaxation as relaxation_module
  asked = []
  answers = {}

  def fake_solve(graph, period, limit, *, time_limit_s, proof_only, **kw):
    assert proof_only  # a relaxed repetend is of no use: prove or give up
    asked.append((period, time_limit_s))
    return answers.get(period, ModuloSolution("UNKNOWN", work=time_limit_s))

  monkeypatch.setattr(relaxation_module, "solve_modulo", fake_solve)
  pooled = relaxations(placements.get("finetune", 4), 1)[1]
  assert pooled.proves_infeasible(12, time_limit_s=1.0) == (False, 1.0)
  assert pooled.proves_infeasible(12, time_limit_s=1.0) == (False, 0.0)
  assert pooled.proves_infeasible(14, time_limit_s=0.5) == (False, 0.0)
  assert pooled.proves_infeasible(11, time_limit_s=1.0) == (False, 1.0)
  assert pooled.proves_infeasible(12, time_limit_s=4.0) == (False, 4.0)
  answers[13] = ModuloSolution("OPTIMAL", offsets=(0,), phases=(0,),
                               work=0.1)
  assert pooled.proves_infeasible(13, time_limit_s=8.0) == (False, 0.1)
  assert pooled.proves_infeasible(13, time_limit_s=16.0) == (False, 0.0)
  assert asked == [(12, 1.0), (11, 1.0), (12, 4.0), (13, 8.0)]


def test_proof_only_solve_decides_like_the_staged_one():
  # Only the LP-guided stage runs: it still proves 25 infeasible for xshape
  # at one activation per device, and finds a repetend at 26.
  graph = placements.get("xshape", 4)
  assert solve_modulo(graph, 25, 1, time_limit_s=10.0,
                      proof_only=True).status == "INFEASIBLE"
  found = solve_modulo(graph, 26, 1, time_limit_s=10.0, proof_only=True)
  assert found.found
  assert steady_peak(graph, 26, found.phases, found.offsets) <= 1
