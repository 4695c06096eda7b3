"""Backward kernels priced net of their fused gradient adds
(``cost.fused_grads``, ``TESSEL_JAX_FUSED_GRADS``).

With the switch on, a kernel with parameter gradients is profiled with
them added into accumulators (as ``passes.predicated`` runs it) less its
twin running the adds alone on the same call. The pricing term is checked
on fixed synthetic timings; the programs on the ``test_tick_kernel``
model.
"""

from __future__ import annotations

import jax
import numpy as np
import pytest

from tessel_jax.cost import fused_grads, measure

import test_tick_kernel as TK


def test_switch_reads_its_environment_variable():
  assert not fused_grads.enabled({})
  assert not fused_grads.enabled({fused_grads.ENV: "0"})
  assert fused_grads.enabled({fused_grads.ENV: "1"})


def test_applies_only_to_kernels_with_gradients_on_one_device():
  on = {fused_grads.ENV: "1"}

  class K:  # pylint: disable=too-few-public-methods
    def __init__(self, grads):
      self.grads = grads

  assert fused_grads.applies(K((0, 1)), None, on)
  assert not fused_grads.applies(K(()), None, on)
  assert not fused_grads.applies(K((0,)), object(), on)
  assert not fused_grads.applies(K((0,)), None, {})


@pytest.mark.parametrize("raw,adds,want", [
    (3e-4, 1e-4, 2e-4),        # the kernel's time over its adds
    (3e-4, 2.99e-4, 1.5e-5),   # never below FLOOR of the raw time
    (3e-4, 4e-4, 1.5e-5),      # a twin timed slower: the floor
])
def test_net_seconds_on_fixed_timings(raw, adds, want):
  assert fused_grads.net_seconds(raw, adds) == pytest.approx(want)


def test_timed_alternates_and_keeps_each_programs_smallest_round(monkeypatch):
  """Rounds alternate kernel and twin; the smallest of each is kept and
  the net is their difference (synthetic timings: no clock read)."""
  calls = []
  kernel_s, twin_s = iter([5e-4, 3e-4, 4e-4]), iter([2e-4, 1.5e-4, 1e-4])

  def fake(fn, repeats, warmup, cpu_clock=False):
    which = fn()
    calls.append(which)
    return (next(kernel_s) if which == "k" else next(twin_s)), 1

  monkeypatch.setattr(fused_grads, "time_calls", fake)
  net, raw, base = fused_grads.timed(lambda p, d: "k", lambda p, d: "t",
                                     [], [], 3, 1, None, 3)
  assert calls == ["k", "t"] * 3
  assert (raw, base) == (3e-4, 1e-4)
  assert net == pytest.approx(2e-4)


def _backward_kernels():
  fn, params, batch = TK.gram_model()
  built = TK._step(fn, False, "uniform").build(params, batch)  # pylint: disable=protected-access
  avals = built.partition.traced.param_avals
  kernels = list(built.kernels.kernels.values())
  assert any(k.grads for k in kernels)
  return avals, kernels


def test_profiled_backward_adds_its_gradients_and_its_twin_the_adds_only(
    monkeypatch):
  monkeypatch.setenv(fused_grads.ENV, "1")
  avals, kernels = _backward_kernels()
  dev = jax.devices()[0]
  for k in kernels:
    job = measure.lower_kernel(k, avals, dev)
    n = len(k.grads)
    assert len(job.dv) == len(k.in_avals) + n + 1, k.label
    if not n:
      continue
    accs = job.dv[-1 - n:-1]
    got = jax.tree.leaves(job.lowered.compile()(job.pv, job.dv))
    outs, grads = measure.kernel_callable(k)(job.pv, job.dv[:len(k.in_avals)])
    for g, o in zip(got[:len(outs)], outs):
      np.testing.assert_allclose(g, o, rtol=1e-5, atol=1e-6)
    for g, want, acc in zip(got[len(outs):], grads, accs):
      np.testing.assert_allclose(g, np.asarray(want) + np.asarray(acc),
                                 rtol=1e-5, atol=1e-5)
    p, d = measure.kernel_avals(k, avals)
    twin = jax.tree.leaves(fused_grads.twin(k, p, d, False, job.pv,
                                            job.dv)(job.pv, job.dv))
    assert len(twin) == len(got)
    for t in twin[:len(outs)]:
      assert not np.any(np.asarray(t))
    for t, acc in zip(twin[len(outs):], accs):
      np.testing.assert_allclose(t, 2 * np.asarray(acc), rtol=1e-6)


def test_switch_keys_backward_kernels_apart_and_records_the_twin(
    monkeypatch):
  avals, kernels = _backward_kernels()
  dev = jax.devices()[0]
  off = {id(k): measure.kernel_key(k, avals, dev) for k in kernels}
  monkeypatch.setenv(fused_grads.ENV, "1")
  for k in kernels:
    on = measure.kernel_key(k, avals, dev)
    assert (on != off[id(k)]) == bool(k.grads), k.label
  back = next(k for k in kernels if k.grads)
  rec = measure.time_kernel(back, avals, dev, repeats=2, warmup=1, rounds=1)
  assert rec["adds_raw_seconds"] > 0
  assert rec["seconds"] == pytest.approx(fused_grads.net_seconds(
      rec["raw_seconds"], rec["adds_raw_seconds"]))
