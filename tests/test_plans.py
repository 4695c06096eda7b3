"""tj.frontier (every plan of a program, priced) and placement="auto"."""

from __future__ import annotations

import re
import types

import jax
import jax.numpy as jnp
import pytest

import tessel_jax as tj
from tessel_jax import frontier_memo as FM
from tessel_jax import plans as P

import test_lowering_models as M

KINDS = ["embed", "mixed", "layer", "head"]
NAMES = ("vshape", "mshape")


def _plan(step, peak, name="vshape"):
  return P.PricedPlan(candidate=P.Candidate(name, 2, 1, 4), step=step,
                      unit="ms", peak_bytes_per_device=(peak, peak // 2),
                      source="tessel", blocks=2, build_seconds=0.0)


def test_pareto_choose_and_runner_up_on_hand_made_points():
  pts = [(10.0, 100), (8.0, 300), (12.0, 50), (9.0, 300), (8.0, 300),
         (20.0, 40), (11.0, 120)]
  plans = [_plan(s, m, name=f"p{i}") for i, (s, m) in enumerate(pts)]
  fr = P.ProgramFrontier(fn_name="f", plans=tuple(plans),
                         pareto=P.pareto(plans))
  # (9, 300) is beaten by (8, 300); (11, 120) by (10, 100); both copies of
  # (8, 300) stay.
  assert fr.pareto == (1, 4, 0, 2, 5)
  assert fr.choose(None) is plans[1]
  assert fr.choose(100) is plans[0] and fr.choose(99) is plans[2]
  assert fr.choose(39) is None
  assert fr.runner_up(None) is plans[4] or fr.runner_up(None) is plans[3]
  assert fr.smallest_peak() is plans[5]


def _inputs():
  return M.make_params(M.num_layers(KINDS)), M.make_batch(16)


def test_frontier_prices_every_width_and_placement(tmp_path):
  params, batch = _inputs()
  mesh = jax.make_mesh((4,), ("pipe",))
  fr = tj.frontier(M.chain_fn(KINDS), mesh=mesh, placements=NAMES,
                   microbatches=[4])(params, batch)
  shapes = {(p.candidate.placement, p.candidate.pipe, p.candidate.dp)
            for p in fr.plans}
  assert {("vshape", 4, 1), ("vshape", 2, 2), ("mshape", 4, 1)} <= shapes
  assert any(p.candidate.plan == "1f1b" for p in fr.plans)
  for p in fr.plans:
    assert p.step > 0 and p.peak_bytes > 0 and p.unit == "steps"
  # The Pareto set is exactly the plans no other plan beats in both.
  for i, p in enumerate(fr.plans):
    beaten = any(q.step <= p.step and q.peak_bytes <= p.peak_bytes and
                 (q.step, q.peak_bytes) != (p.step, p.peak_bytes)
                 for q in fr.plans)
    assert (i in fr.pareto) == (not beaten)
  limit = sorted(p.peak_bytes for p in fr.plans)[len(fr.plans) // 2]
  chosen = fr.choose(limit)
  assert chosen.peak_bytes <= limit
  assert all(p.step >= chosen.step for p in fr.plans if p.peak_bytes <= limit)
  path = fr.plot(str(tmp_path / "f.png"), memory_limit=limit)
  assert (tmp_path / "f.png").stat().st_size > 1000 and path.endswith(".png")
  assert "Pareto" in str(fr)


def test_auto_matches_value_and_grad_fits_the_limit_and_explains(monkeypatch):
  monkeypatch.setattr(P, "DEFAULT_PLACEMENTS", NAMES)
  params, batch = _inputs()
  fn = M.chain_fn(KINDS)
  mesh = jax.make_mesh((4,), ("pipe",))
  with pytest.raises(tj.TesselError, match="smallest peak is") as info:
    tj.schedule(fn, mesh=mesh, placement="auto", num_microbatches=4,
                memory_limit=1000).build(params, batch)
  smallest = int(re.search(r"smallest peak is (\d+)", str(info.value))[1])
  assert f"memory_limit >= {smallest}" in str(info.value)
  step = tj.schedule(fn, mesh=mesh, placement="auto", num_microbatches=4,
                     memory_limit=smallest)
  loss, grads = step(params, batch)
  ref_loss, ref_grads = M.reference(fn, params, batch, 4)
  assert M.max_rel_err(loss, ref_loss) <= 1e-5
  assert M.max_rel_err(grads, ref_grads) <= 1e-5
  assert max(step.report.peak_memory_bytes) <= smallest
  assert step.choice.winner.peak_bytes <= smallest
  assert "placement='auto' chose" in step.report.chosen_plan
  # The runner-up is named where a plan of another shape fits; at the
  # smallest limit there may be none (every other shape peaks above it).
  fr = step.choice.frontier
  mine = P.shape_of(step.choice.winner.candidate)
  others = [p for p in fr.plans if P.shape_of(p.candidate) != mine]
  assert others   # several shapes were priced
  if any(p.peak_bytes <= smallest for p in others):
    assert "runner-up" in step.report.chosen_plan
  else:
    assert fr.runner_up(smallest) is None
    assert "runner-up" not in step.report.chosen_plan
    assert fr.runner_up(None) is not None   # without a limit there is one
  with pytest.raises(tj.TesselError, match="drop plan="):
    tj.schedule(fn, mesh=mesh, placement="auto", plan="1f1b")


def test_auto_plan_runner_summary_and_limits():
  from experiments import auto_plan_lib as A  # pylint: disable=import-outside-toplevel
  from experiments import auto_plan_summary as S  # pylint: disable=import-outside-toplevel
  assert A.parse_limit("none") is None
  assert A.parse_limit("2MiB") == 2 * 2**20 and A.parse_limit("123") == 123
  rows = [{"label": "a", "predicted_ms": 1.0, "chosen": True,
           "measured_ms": 10.4},
          {"label": "b", "predicted_ms": 2.0, "chosen": False,
           "measured_ms": 10.0},
          {"label": "c", "predicted_ms": 3.0, "chosen": False,
           "error": "x"}]
  got = S.summarise(rows)
  assert got["fastest_measured"] == "b" and got["chosen"] == "a"
  assert got["chosen_over_fastest"] == 1.04 and got["within_target"]
  rows[0]["measured_ms"] = 11.0
  assert not S.summarise(rows)["within_target"]
  assert "chosen_over_fastest_cpu" not in got
  rows[0]["measured_cpu_ms"], rows[1]["measured_cpu_ms"] = 6.0, 5.0
  got = S.summarise(rows)
  assert got["chosen_over_fastest_cpu"] == 1.2 and got["fastest_cpu"] == "b"
  assert "paired_wall_cpu" not in got  # no per-round times
  # Paired: per round chosen / other, then the median over rounds.
  rows[0]["rounds_ms"] = [[10.0, 5.0], [30.0, 6.0], [11.0, 6.0]]
  rows[1]["rounds_ms"] = [[10.0, 5.0], [20.0, 4.0], [10.0, 5.0]]
  got = S.summarise(rows)
  assert got["paired_wall_cpu"] == {"b": [1.1, 1.2]}
  assert got["chosen_over_best_paired"] == 1.1
  assert got["chosen_over_best_paired_cpu"] == 1.2
  # The plain step timed beside them is a reference, never a candidate.
  rows.append({"label": A.REFERENCE, "reference": True, "chosen": False,
               "measured_ms": 1.0, "measured_cpu_ms": 2.0})
  got = S.summarise(rows)
  assert got["fastest_measured"] == "b" and got["fastest_cpu"] == "b"
  assert got["reference_ms"] == [1.0, 2.0]
  assert A.REFERENCE not in got["paired_wall_cpu"]
  # The control (the chosen plan compiled again) is the noise floor, never
  # a candidate, even when it measures fastest.
  rows.append({"label": "a " + A.CONTROL, "control": True, "chosen": False,
               "measured_ms": 0.5, "measured_cpu_ms": 0.5,
               "rounds_ms": [[10.0, 5.0], [33.0, 6.0], [12.0, 3.0]]})
  got = S.summarise(rows)
  assert got["fastest_measured"] == "b" and "a " + A.CONTROL not in got[
      "paired_wall_cpu"]
  assert got["chosen_over_control_paired"] == [0.9167, 1.0]
  assert got["control_ms"] == [0.5, 0.5]


def test_auto_plan_runner_times_rows_against_the_reference():
  from experiments import auto_plan_lib as A  # pylint: disable=import-outside-toplevel
  rows = [{"label": "a"}, {"label": "b"}, {"label": A.REFERENCE,
                                           "reference": True}]
  zero = lambda p, b: jnp.zeros(())  # pylint: disable=unnecessary-lambda-assignment
  A._time_rows({0: zero, 2: zero}, rows, None, None, 3)  # pylint: disable=protected-access
  assert len(rows[0]["rounds_ms"]) == 3 and "measured_ms" not in rows[1]
  assert rows[2]["x_reference"] == [1.0, 1.0]
  assert all(x > 0 for x in rows[0]["x_reference"])


def test_auto_plan_runner_measures_each_placements_fastest():
  from experiments import auto_plan_lib as A  # pylint: disable=import-outside-toplevel
  from tessel_jax import plans as P  # pylint: disable=import-outside-toplevel

  def plan(name, step, peak, how=None):
    return P.PricedPlan(candidate=P.Candidate(name, 2, 2, 8, how), step=step,
                        unit="ms", peak_bytes_per_device=(peak,),
                        source="x", blocks=2, build_seconds=0.0)
  a, b, c = plan("vshape", 1.0, 5), plan("vshape", 2.0, 5, "1f1b"), plan(
      "mshape", 3.0, 5)
  big, d = plan("mllm", 0.5, 99), plan("zbv", 9.0, 5)
  got = A.to_measure([big, b, a, c, d], a, 10, 1)
  # The winner, the top-1 fitting plan (the winner itself), then each other
  # placement's fastest fitting plan; mllm does not fit the limit.
  assert [p.candidate.label for p in got] == [
      a.candidate.label, c.candidate.label, d.candidate.label]
  assert len(A.to_measure([big, b, a, c, d], a, None, 0)) == 5



def test_auto_plan_runner_replays_a_measured_tiebreak():
  from experiments import auto_plan_summary as A  # pylint: disable=import-outside-toplevel
  chosen = {"label": "a", "predicted_ms": 10.0, "chosen": True,
            "rounds_ms": [[12.0, 1.0], [12.0, 1.0], [12.0, 1.0], [9.0, 1.0]]}
  tie = {"label": "b", "predicted_ms": 10.3, "chosen": False,
         "build_compile_s": [2.0, 2.5],
         "rounds_ms": [[10.0, 1.0], [11.0, 1.0], [10.0, 1.0], [12.0, 1.0]]}
  far = {"label": "c", "predicted_ms": 11.0, "chosen": False,
         "build_compile_s": [9.0, 9.0],
         "rounds_ms": [[1.0, 1.0]] * 4}
  got = A.tiebreak([chosen, tie, far], chosen, steps=3)
  # c is predicted 10% slower: no tie, never timed, even though fastest.
  assert got["tiebreak"] == ["a", "b"] and got["tiebreak_pick"] == "b"
  # b over each other candidate on the rounds after the 3 it was picked
  # on (out of sample), the worst median: the 4th round, over c.
  assert got["tiebreak_over_best_paired"] == 12.0
  # b's build and compile, then three steps of each tied plan.
  assert got["tiebreak_cost_s"] == round(2.0 + (36.0 + 31.0) / 1e3, 2)
  assert A.tiebreak([chosen, far], chosen) == {}


def test_auto_plan_runner_limits_between_the_smallest_plan_and_the_choice():
  from experiments import auto_plan_lib as A  # pylint: disable=import-outside-toplevel
  from tessel_jax import plans as P  # pylint: disable=import-outside-toplevel

  def plan(name, peak):
    return P.PricedPlan(candidate=P.Candidate(name, 2, 2, 8), step=1.0,
                        unit="ms", peak_bytes_per_device=(peak, peak - 1),
                        source="x", blocks=2, build_seconds=0.0)
  small, chosen = plan("zbv", 1000), plan("vshape", 4000)
  choice = types.SimpleNamespace(frontier=types.SimpleNamespace(
      plans=[chosen, plan("mllm", 9000), small]), winner=chosen)
  assert A.resolve_limit("between:0", choice) == 1000
  assert A.resolve_limit("between:0.5", choice) == 2500
  assert A.resolve_limit("between:1", choice) == 4000
  assert A.resolve_limit("2KiB", choice) == 2048
  assert A.resolve_limit("none", choice) is None
  with pytest.raises(ValueError, match="in \\[0, 1\\]"):
    A.resolve_limit("between:1.5", choice)


def test_auto_plan_runner_between_floor_counts_the_screened_workspace():
  # A screened price leaves out the kernel workspace: its peak is below
  # its full build's, so a floor at it gave a limit no plan fits
  # (eqx_transformer, 8 devices, session 33: between:0.33 = 398,187 B). A
  # screened peak (and a classic schedule priced on a screened build)
  # counts with the largest full - screened gap of the plans priced both
  # ways in this process.
  from experiments import auto_plan_lib as A  # pylint: disable=import-outside-toplevel

  def plan(name, peak, plan=None, screened=False):
    return P.PricedPlan(candidate=P.Candidate(name, 2, 2, 8, plan), step=1.0,
                        unit="ms", peak_bytes_per_device=(peak,), source="x",
                        blocks=2, build_seconds=0.0, screened=screened)
  chosen = plan("vshape", 4000)
  low_screened = plan("zbv", 1000, screened=True)
  on_screened = plan("zbv", 900, plan="1f1b")   # priced on zbv's screened build
  full_small = plan("vshape", 2000, plan="gpipe")  # on vshape's full build
  choice = types.SimpleNamespace(frontier=types.SimpleNamespace(
      plans=[chosen, low_screened, on_screened, full_small]), winner=chosen)
  P.clear_memo()
  try:
    assert A.workspace_gap(choice.frontier.plans) == 0  # nothing both ways
    assert A.resolve_limit("between:0", choice) == 900
    FM.remember(FM.plan_key("K", chosen.candidate, True),
                plan("vshape", 3400, None, True), None)
    FM.remember(FM.plan_key("K", chosen.candidate, False), chosen, None)
    FM.remember_bound("K", low_screened.candidate, 0.5)
    assert A.workspace_gap(choice.frontier.plans) == 600
    assert A.floor_peak(choice.frontier.plans) == 1500   # 900 + 600
    assert A.resolve_limit("between:0.5", choice) == 2750
    # The floor above the choice's peak: the limit is the floor.
    odd = types.SimpleNamespace(frontier=choice.frontier,
                                winner=plan("zbv", 800, screened=True))
    assert A.resolve_limit("between:0.5", odd) == 1500
  finally:
    P.clear_memo()


def test_unlimited_choice_takes_a_faster_plan_searched_under_a_limit(
    monkeypatch):
  # README GPT, 8 devices (session 33): the search under 4.64 MB found 39.77
  # ms at 3.88 MB, the search without a limit 40.51 ms at 5.08 MB. A plan
  # that fits a limit fits no limit (and every larger one): a frontier of
  # the same program priced later in the process chooses the fastest of
  # every plan priced, not only of its own searches.
  import numpy as np  # pylint: disable=import-outside-toplevel
  P.clear_memo()
  mine = P.Candidate("vshape", 2, 4, 8)
  lim = P.Candidate("vshape", 2, 4, 8, memory_limit=4_640_000)
  other = P.Candidate("interleaved", 2, 4, 8, memory_limit=4_640_000)
  bound = P.Candidate("vshape", 2, 4, 8, memory_limit=4_000_000)

  def priced(c, step, peak, **kw):
    return P.PricedPlan(candidate=c, step=step, unit="ms",
                        peak_bytes_per_device=(peak,), source="tessel",
                        blocks=2, build_seconds=0.0, **kw)
  own = priced(mine, 40.51, 5_080_000)
  at_limit = priced(lim, 39.77, 3_880_000)
  FM.remember(FM.plan_key("K", lim, False), at_limit, "lim step")
  FM.remember(FM.plan_key("K", other, False),
              priced(other, 30.0, 3_000_000), "x")
  FM.remember(FM.plan_key("K", bound, False),
              priced(bound, 20.0, 3_500_000, bound=True), "y")
  FM.remember(FM.plan_key("K", lim, True),
              priced(lim, 10.0, 3_880_000, screened=True), "z")
  FM.remember(FM.plan_key("other program", lim, False),
              priced(lim, 5.0, 100), "w")
  assert [e.candidate for e in FM.entries("K")] == [lim, other, bound, lim]
  assert len(FM.entries()) == 5
  monkeypatch.setattr(P, "candidates", lambda *a, **k: [mine])

  def frontier_at(limit):
    ff = P.FrontierFunction(lambda p, b: 0.0, mesh=None, placements=["vshape"],
                            memory_limit=limit)
    ff._key = "K"
    monkeypatch.setattr(ff, "_price_all", lambda *a, **k: [own])
    return ff, ff._price_frontier({}, np.zeros((8, 2)), None, 0.0)
  try:
    ff, fr = frontier_at(None)
    # Neither the lower bound, the screened price, another program's plan
    # nor a placement this frontier does not try.
    assert [p.step for p in fr.plans] == [40.51, 39.77]
    assert fr.choose(None) is at_limit and ff.steps[lim] == "lim step"
    assert frontier_at(4_000_000)[1].choose(4_000_000) is at_limit
    assert frontier_at(3_000_000)[1].plans == (own,)  # 3.88 MB: no fit
  finally:
    P.clear_memo()


def test_auto_plan_runner_times_one_program_once():
  # A search under a limit its unlimited plan fits gives the same program:
  # the runner times it once (quiet session 32, README GPT at 6.3 MiB: two
  # copies of one program measured 35.16 and 34.03 ms, the faster was
  # "the fastest candidate").
  from experiments import auto_plan_lib as A  # pylint: disable=import-outside-toplevel
  params, batch = _inputs()
  mesh = jax.make_mesh((4,), ("pipe",))
  ff = P.FrontierFunction(M.chain_fn(KINDS), mesh=mesh, cost="uniform")
  texts = [ff.step_for(c).lower(params, batch).as_text() for c in (
      P.Candidate("interleaved", 2, 2, 4),
      P.Candidate("interleaved", 2, 2, 4, memory_limit=2**40),
      P.Candidate("interleaved", 2, 2, 4, "gpipe"))]
  seen: dict[str, str] = {}
  assert A.same_program(seen, texts[0], "searched") is None
  assert A.same_program(seen, texts[1], "searched@limit") == "searched"
  assert A.same_program(seen, texts[2], "gpipe") is None
  assert seen == {texts[0]: "searched", texts[2]: "gpipe"}
