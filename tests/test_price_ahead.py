"""The first price's programs compiled ahead on the background thread
(``cost.price_ahead``): taken by the price, nothing left behind, nothing
compiled that the cache answers, and off with ``TESSEL_JAX_PRICE_AHEAD=0``."""

from __future__ import annotations

import jax
import pytest

import tessel_jax as tj
from tessel_jax import placements
from tessel_jax.cost import compile_pool, price_ahead

from test_cost import _tiny

pytestmark = pytest.mark.usefixtures("shared_tick_costs")


def _record(monkeypatch):
  """Keys handed to the background thread and keys taken back compiled."""
  got = {"called": [], "taken": []}
  bg = compile_pool.BACKGROUND
  call, take = bg.call, bg.take_call

  def recording_call(key, fn):
    got["called"].append(key)
    call(key, fn)

  def recording_take(key):
    out = take(key)
    if out is not None:
      got["taken"].append(key)
    return out

  monkeypatch.setattr(bg, "call", recording_call)
  monkeypatch.setattr(bg, "take_call", recording_take)
  return got


def _build(tmp_path):
  fn, params, batch = _tiny(kinds=("embed", "head"))
  step = tj.schedule(fn, mesh=jax.make_mesh((2,), ("pipe",)),
                     placement=placements.vshape(2), num_microbatches=4,
                     cost="measured", cache_dir=str(tmp_path))
  step.build(params, batch)
  return step


def test_the_outside_program_is_compiled_ahead_and_taken(monkeypatch,
                                                         tmp_path):
  got = _record(monkeypatch)
  step = _build(tmp_path)
  assert step.report.outside_ms > 0
  outside = [k for k in got["called"] if k.startswith("outside:")]
  assert len(outside) == 1 and outside[0] in got["taken"]
  # Every key handed over was taken or dropped at the build's end.
  assert not any(k in compile_pool.BACKGROUND._jobs  # pylint: disable=protected-access
                 for k in got["called"])


def test_nothing_compiled_ahead_that_the_cache_answers(monkeypatch, tmp_path):
  _build(tmp_path)
  got = _record(monkeypatch)
  _build(tmp_path)  # a new function on the same cache: figures stored
  assert got["called"] == []


def test_switched_off(monkeypatch, tmp_path):
  monkeypatch.setenv(price_ahead.ENV, "0")
  got = _record(monkeypatch)
  assert _build(tmp_path).report.outside_ms > 0
  assert got["called"] == []
  monkeypatch.setenv(price_ahead.ENV, "2")
  with pytest.raises(ValueError, match="TESSEL_JAX_PRICE_AHEAD"):
    price_ahead.enabled()
