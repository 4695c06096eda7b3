"""``experiments.search_profile_lib``: the search's solves and steps are
recorded inside ``profiled()`` and the spies are gone after it."""

from experiments import search_profile_lib
from tessel_jax import placements
from tessel_jax.search import compose, modulo_model, period_search
from tessel_jax.search import search_repetend


def test_profiled_records_solves_by_step_and_restores_the_search(
    monkeypatch):
  # The first probe's solves (the constructive scheduler would build this
  # repetend without one).
  monkeypatch.setattr(period_search, "CONSTRUCT_TRIES", 0)
  before = (period_search.first_probe, compose.polished,
            modulo_model._solve_once)  # pylint: disable=protected-access
  graph = placements.get("nnshape", 4, mode="train")
  with search_profile_lib.profiled() as prof:
    search_repetend(graph, 16, time_limit_s=2)
  steps = {s["step"] for s in prof.solves}
  assert "first_probe" in steps and "latency_polish" in steps
  assert all(s["det_s"] >= 0 and s["cpu_s"] >= 0 for s in prof.solves)
  first = [s for s in prof.solves if s["step"] == "first_probe"]
  assert all(s["period"] == 16 for s in first)  # the busiest device's load
  summary = prof.summary()
  assert set(summary["solves_per_step"]) == steps
  assert summary["step_cpu_s"]["first_probe"] >= (
      summary["solves_per_step"]["first_probe"]["cpu_s"] - 0.05)
  assert (period_search.first_probe, compose.polished,
          modulo_model._solve_once) == before  # pylint: disable=protected-access
