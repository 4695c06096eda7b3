"""The screening's lower bound (``FrontierFunction(screen_prune=True)``,
``placement="auto"``'s default): a searched plan whose bound on its
screening kernels is at least ``1 + refine_margin`` times the fastest
fitting screened price so far is not searched, nor are its classic
schedules priced."""

from __future__ import annotations

import dataclasses

import jax
import pytest

from tessel_jax import auto
from tessel_jax import frontier_step, frontier_sweep
from tessel_jax import plans as P


def _ff(screen_prune=True, memory_limit=None):
  return P.FrontierFunction(
      lambda p, b: 0.0, mesh=jax.make_mesh((2,), ("pipe",),
                                           devices=jax.devices()[:2]),
      refine=1, prune=True, screen_time_limit_s=1.0, screen_estimate=True,
      refine_margin=0.25, screen_prune=screen_prune,
      memory_limit=memory_limit)


def _plan(c, step, screened=True, peak=50):
  return P.PricedPlan(candidate=c, step=step, unit="ms",
                      peak_bytes_per_device=(peak,), source="tessel",
                      blocks=2, build_seconds=0.0, screened=screened)


def test_the_screened_bound_prunes_at_the_refine_margin():
  ff = _ff(memory_limit=100)
  c = P.Candidate("zbv", 2, 1, 4)
  ff._check_screened_bound(c, 1e9)   # nothing screened yet
  ff._note_best(_plan(P.Candidate("vshape", 2, 1, 4), 20.0, peak=500))
  ff._check_screened_bound(c, 1e9)   # over the limit: no best to beat
  ff._note_best(_plan(P.Candidate("vshape", 2, 1, 4), 10.0))
  assert ff._best_ms is None         # estimated: not a measured best
  ff._check_screened_bound(c, 12.49)
  with pytest.raises(P.Pruned, match=r"screening lower bound 12.500 ms"):
    ff._check_screened_bound(c, 12.5)
  assert ff.pruned == 1
  # A measured plan is the measured best, not the screened one.
  ff._note_best(_plan(P.Candidate("mshape", 2, 1, 4), 5.0, screened=False))
  assert (ff._best_ms, ff._best_screened_ms) == (5.0, 10.0)


def _sweep(monkeypatch, screen_prune, bounds_ms):
  """``price_all`` over vshape and zbv (each with a classic schedule);
  a screening build calls its step's ``price_bound`` (as
  ``step_build._search_graph`` does) with ``bounds_ms[placement]``, then
  counts as one search."""
  ff = _ff(screen_prune)
  searched = []

  def price(self, c, params, batch, markers=None, screen=False,
            ceiling=True):
    step = self.step_for(c, markers, screen)
    bound = getattr(step, "price_bound", None)
    if bound is not None:
      monkeypatch.setattr(frontier_step, "step_lower_bound",
                          lambda costs, n: bounds_ms[c.placement] / 1e3)
      bound(None, 4)
    searched.append(c.label)
    return _plan(c, {"vshape": 10.0, "zbv": 14.0}[c.placement])
  monkeypatch.setattr(P.FrontierFunction, "price", price)
  monkeypatch.setattr(P.FrontierFunction, "price_baseline",
                      lambda self, c, base: dataclasses.replace(
                          base, candidate=c, step=base.step + 1))
  todo = [P.Candidate("vshape", 2, 1, 4), P.Candidate("vshape", 2, 1, 4,
                                                      "gpipe"),
          P.Candidate("zbv", 2, 1, 4), P.Candidate("zbv", 2, 1, 4, "zbv")]
  skipped = []
  priced = frontier_sweep.price_all(ff, todo, None, None, None, skipped)
  return searched, [p.label for p in priced], skipped


def test_a_plan_bounded_above_the_margin_is_not_searched(monkeypatch):
  searched, priced, skipped = _sweep(monkeypatch, True,
                                     {"vshape": 8.0, "zbv": 12.5})
  # zbv's bound 12.5 >= 1.25 x 10 (vshape screened): no search, and its
  # classic schedule is skipped with it.
  assert searched == ["vshape pipe2 dp1 N4 searched"]
  assert priced == ["vshape pipe2 dp1 N4 searched",
                    "vshape pipe2 dp1 N4 gpipe"]
  assert [label for label, _ in skipped] == ["zbv pipe2 dp1 N4 searched",
                                             "zbv pipe2 dp1 N4 zbv"]
  assert all("screening lower bound" in why for _, why in skipped)


def test_below_the_margin_or_switched_off_every_plan_is_searched(
    monkeypatch):
  both = ["vshape pipe2 dp1 N4 searched", "zbv pipe2 dp1 N4 searched"]
  assert _sweep(monkeypatch, True, {"vshape": 8.0, "zbv": 12.4})[0] == both
  assert _sweep(monkeypatch, False, {"vshape": 8.0, "zbv": 99.0})[0] == both


def test_auto_prunes_screening_by_default():
  """``TESSEL_JAX_SCREEN_PRUNE=0`` is the old path (paired A/B only)."""
  import os  # pylint: disable=import-outside-toplevel
  assert auto.SCREEN_PRUNE == (
      os.environ.get("TESSEL_JAX_SCREEN_PRUNE", "1") != "0")


def test_a_pruned_screening_is_another_frontier_on_disk():
  """Pruned plans are missing from its frontier: keyed apart on disk (and
  the key without the switch is the one before it existed)."""
  from tessel_jax import frontier_keys  # pylint: disable=import-outside-toplevel
  assert frontier_keys._options(_ff(True))["screen_prune"] is True
  assert "screen_prune" not in frontier_keys._options(_ff(False))


def test_the_screening_budget_is_half_a_second_unless_set(monkeypatch):
  """0.5 s (was 1 s: the same screened makespans on the README GPT at
  half the CP-SAT CPU); ``TESSEL_JAX_SCREEN_TIME_LIMIT_S`` sets another."""
  import os  # pylint: disable=import-outside-toplevel
  if "TESSEL_JAX_SCREEN_TIME_LIMIT_S" not in os.environ:
    assert auto.SCREEN_TIME_LIMIT_S == 0.5
  assert auto._env_seconds("TESSEL_JAX_NOT_SET_HERE", 0.5) == 0.5
  monkeypatch.setenv("TESSEL_JAX_SCREEN_BUDGET_TEST", "1.0")
  assert auto._env_seconds("TESSEL_JAX_SCREEN_BUDGET_TEST", 0.5) == 1.0
  for bad in ("0", "-1", "soon"):
    monkeypatch.setenv("TESSEL_JAX_SCREEN_BUDGET_TEST", bad)
    with pytest.raises(ValueError, match="TESSEL_JAX_SCREEN_BUDGET_TEST"):
      auto._env_seconds("TESSEL_JAX_SCREEN_BUDGET_TEST", 0.5)
