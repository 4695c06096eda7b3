"""The user function traced once per (function, avals) in a process
(``tessel_jax.trace_memo``): counted, not timed."""

from __future__ import annotations

import jax
import pytest

import tessel_jax as tj
from tessel_jax import trace_memo
from tessel_jax.passes import tracing as _tracing

import test_lowering_models as M

KINDS = ["embed", "layer", "layer", "head"]


@pytest.fixture(autouse=True)
def _fresh():
  trace_memo.clear()
  yield
  trace_memo.clear()


def _counting(monkeypatch) -> list[tuple]:
  """Every ``passes.tracing.trace`` call's micro-batch shapes."""
  calls: list[tuple] = []
  real = _tracing.trace

  def counted(fn, name, params, microbatch, **kw):
    calls.append(tuple(x.shape for x in jax.tree_util.tree_leaves(
        microbatch)))
    return real(fn, name, params, microbatch, **kw)
  monkeypatch.setattr(_tracing, "trace", counted)
  return calls


def _build(fn, devices, microbatches=4):
  step = tj.schedule(fn, mesh=jax.make_mesh((2,), ("pipe",)),
                     placement=tj.Placement(list(devices)),
                     num_microbatches=microbatches, cost="uniform")
  return step.build(M.make_params(M.num_layers(KINDS)), M.make_batch(16))


def test_two_placements_of_one_function_trace_it_once(monkeypatch):
  monkeypatch.setenv(trace_memo.ENV, "1")
  calls = _counting(monkeypatch)
  fn = M.chain_fn(KINDS)
  first = _build(fn, [0, 0, 1, 1])
  second = _build(fn, [0, 1, 1, 1])
  assert calls == [((4, M.SEQ), (4, M.SEQ))]
  assert first.partition.traced is not None and second is not None
  # Another micro-batch shape is another trace.
  _build(fn, [0, 0, 1, 1], microbatches=2)
  assert len(calls) == 2 and calls[1] == ((8, M.SEQ), (8, M.SEQ))


def test_switched_off_every_build_traces(monkeypatch):
  monkeypatch.setenv(trace_memo.ENV, "0")
  calls = _counting(monkeypatch)
  fn = M.chain_fn(KINDS)
  _build(fn, [0, 0, 1, 1])
  _build(fn, [0, 1, 1, 1])
  assert len(calls) == 2


def test_another_function_or_option_is_another_trace(monkeypatch):
  monkeypatch.setenv(trace_memo.ENV, "1")
  calls = _counting(monkeypatch)
  fn, other = M.chain_fn(KINDS), M.chain_fn(KINDS)
  params = M.make_params(M.num_layers(KINDS))
  mb = jax.tree_util.tree_map(lambda x: jax.ShapeDtypeStruct(
      (4,) + x.shape[1:], x.dtype), M.make_batch(16))
  a = trace_memo.trace(fn, "f", params, mb)
  assert trace_memo.trace(fn, "f", params, mb) is a
  trace_memo.trace(other, "f", params, mb)
  trace_memo.trace(fn, "f", params, mb, dead_taps=True)
  assert len(calls) == 3


def test_the_switch_refuses_other_values(monkeypatch):
  monkeypatch.setenv(trace_memo.ENV, "on")
  with pytest.raises(ValueError, match="TESSEL_JAX_TRACE_MEMO"):
    trace_memo.enabled()
