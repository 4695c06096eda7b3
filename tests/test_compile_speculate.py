"""Kernels compiled in the background during the screening
(``cost.compile_pool.BACKGROUND``, ``frontier_speculate``).

A screened plan close to the fastest one hands its estimated kernels to a
background compile thread; the full build's profile takes them compiled
instead of compiling them again, and every timing in the process waits
for that thread first (no kernel is timed beside a compile).
"""

from __future__ import annotations

import threading
import time

import jax
import pytest

from tessel_jax import frontier_speculate
from tessel_jax.cost import calibrate, call_timing, compile_pool, estimate
from tessel_jax.cost import measure, outside, ticks
from tessel_jax.frontier_result import Candidate, PricedPlan

import test_compile_pool as CP


class _SlowLowered:
  """A lowered program whose compile takes ``seconds`` and then says so."""

  def __init__(self, seconds: float, done: threading.Event):
    self.seconds, self.done = seconds, done

  def compile(self):
    time.sleep(self.seconds)
    self.done.set()
    return "compiled"


@pytest.fixture(name="background")
def _background(monkeypatch):
  bg = compile_pool.Background()
  monkeypatch.setattr(compile_pool, "BACKGROUND", bg)
  monkeypatch.setattr(compile_pool, "SPECULATE", True)
  monkeypatch.setattr(measure, "_ESTIMATED", {})
  yield bg
  bg.clear()


def _in_flight(bg: compile_pool.Background) -> threading.Event:
  done = threading.Event()
  bg.submit("slow", compile_pool.Lowered(_SlowLowered(0.3, done), [], [],
                                         None, 0.0))
  return done


def _restricted(run):
  with call_timing.restricted_cores(1):
    run()


TIMINGS = {
    "time_calls": lambda run: call_timing.time_calls(run, 1, 1),
    "restricted_cores": _restricted,
    "time_outside": lambda run: outside.time_outside(run, None, 1, 1),
    "time_step": lambda run: calibrate.time_step(run, 1, 1, budget_s=0.01),
    "seconds_per_tick": lambda run: ticks._seconds_per_tick(run, 1, 1),  # pylint: disable=protected-access
}


@pytest.mark.parametrize("name", sorted(TIMINGS))
def test_timing_waits_for_the_background_compile(background, name):
  done = _in_flight(background)
  seen: list[bool] = []

  def run():
    seen.append(done.is_set())
    return jax.numpy.zeros(())
  TIMINGS[name](run)
  assert seen and all(seen), name


def test_take_waits_and_hands_the_kernel_once(background):
  done = _in_flight(background)
  assert background.has("slow")
  got = background.take("slow")
  assert done.is_set() and got.compiled == "compiled"
  assert got.compile_seconds >= 0.3
  assert background.take("slow") is None and background.taken == 1


def test_estimated_kernels_compiled_in_background_are_taken(monkeypatch,
                                                            background):
  """The kernels a screening profile estimated, handed to the background
  thread, are taken compiled by the profile that measures them: each
  kernel compiled once in all, none timed while a compile is in flight."""
  built = CP._built()   # pylint: disable=protected-access
  sizes = CP._count_batches(monkeypatch)   # pylint: disable=protected-access
  monkeypatch.setattr(estimate, "MIN_SAMPLES", 3)
  screened = CP._profile(built, estimate.KernelEstimator())  # pylint: disable=protected-access
  assert screened.measured == 3 and screened.estimated > 0
  estimated = set(measure._ESTIMATED)   # pylint: disable=protected-access
  keys = [p.key for _, p in sorted(screened.kernels.items())]
  handed = measure.compile_in_background(keys)
  assert handed == len(estimated) > 0
  assert measure.compile_in_background(keys) == 0   # once only
  sizes.clear()
  in_flight = []
  real = measure.time_calls
  monkeypatch.setattr(measure, "time_calls", lambda *a, **k: (
      in_flight.append(any(not f.done() for f in
                           background._jobs.values())) or real(*a, **k)))  # pylint: disable=protected-access
  full = CP._profile(built)   # pylint: disable=protected-access
  distinct = len({p.key for p in full.kernels.values()})
  assert full.measured == distinct
  assert background.taken == handed
  assert sum(sizes) == distinct - handed    # the rest compiled here
  assert in_flight and not any(in_flight)


def _plan(step: float, screened: bool = True, plan: str | None = None,
          peak: int = 100) -> PricedPlan:
  return PricedPlan(candidate=Candidate("vshape", 2, 2, 8, plan),
                    step=step, unit="ms", peak_bytes_per_device=(peak,),
                    source="tessel", blocks=2, build_seconds=0.0,
                    screened=screened)


def test_worth_compiling_within_the_margin_of_the_best_screened():
  best, near, far = _plan(10.0), _plan(12.0), _plan(13.0)
  priced = [best, near, far]
  assert frontier_speculate.worth_compiling(best, priced, 0.25, None)
  assert frontier_speculate.worth_compiling(near, priced, 0.25, None)
  assert not frontier_speculate.worth_compiling(far, priced, 0.25, None)
  # over the memory limit, a classic schedule, a full build: never
  assert not frontier_speculate.worth_compiling(_plan(9.0, peak=200),
                                                priced, 0.25, 150)
  assert not frontier_speculate.worth_compiling(_plan(9.0, plan="1f1b"),
                                                priced, 0.25, None)
  assert not frontier_speculate.worth_compiling(
      _plan(9.0, screened=False), priced, 0.25, None)


def test_switch_off_hands_nothing(monkeypatch, background):
  monkeypatch.setattr(compile_pool, "SPECULATE", False)

  class FF:  # pylint: disable=too-few-public-methods
    screen_estimate, refine_margin, memory_limit, steps = True, 0.25, None, {}
  p = _plan(10.0)
  assert frontier_speculate.after_screened(FF(), p, [p]) == 0
  assert not background.submitted


def test_finish_forgets_what_was_not_taken(background):
  _in_flight(background)
  measure._ESTIMATED["k"] = lambda: None   # pylint: disable=protected-access
  frontier_speculate.finish()
  assert not background.has("slow") and not measure._ESTIMATED   # pylint: disable=protected-access
  assert measure.compile_in_background(["k"]) == 0


def test_after_screened_hands_the_plans_kernels_in_order(monkeypatch,
                                                          background):
  """A screened plan within the margin hands its profile's kernel keys
  (block order) over; one beyond it hands nothing."""
  handed: list[list[str]] = []
  monkeypatch.setattr(measure, "compile_in_background",
                      lambda keys: handed.append(list(keys)) or len(keys))

  class K:  # pylint: disable=too-few-public-methods
    def __init__(self, key):
      self.key = key

  class Step:  # pylint: disable=too-few-public-methods
    class built:  # pylint: disable=invalid-name,too-few-public-methods
      class profile:  # pylint: disable=invalid-name,too-few-public-methods
        kernels = {1: K("b"), 0: K("a")}

  best, far = _plan(10.0), _plan(20.0)

  class FF:  # pylint: disable=too-few-public-methods
    screen_estimate, refine_margin, memory_limit = True, 0.25, None
    steps = {best.candidate: Step()}
  assert frontier_speculate.after_screened(FF(), best, [best]) == 2
  assert handed == [["a", "b"]]
  assert frontier_speculate.after_screened(FF(), far, [best, far]) == 0
