"""The automatic cut prices each micro-batch's parameter-gradient adds
(``passes.autocut_accum``, ``Switches.cut_accumulation``).

A device that holds a large weight used on few rows adds that weight's
whole gradient into its accumulator every micro-batch: three passes over
the weight, more than its kernel moves. Priced on the kernels alone the cut
puts the weight's block beside work it then waits for; priced with the
adds it gives that device less of the rest.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

try:
  from tessel_jax.passes import autocut, autocut_accum
  from tessel_jax.passes.tracing import trace
except ImportError:  # run from the repository root
  from passes import autocut, autocut_accum
  from passes.tracing import trace

ROWS, WIDTH, OUT = 2048, 256, 8192


def _model():
  """Four elementwise layers on 2 MB activations (tiny scale parameters),
  then the row mean times a 256 x 8192 weight (8 MiB: its gradient adds
  cost more than its kernel)."""
  k = jax.random.split(jax.random.PRNGKey(0), 6)
  params = {"s": [jax.random.normal(k[i], (WIDTH,)) for i in range(4)],
            "w": jax.random.normal(k[4], (WIDTH, OUT)) / 16}
  batch = jax.random.normal(k[5], (ROWS, WIDTH))

  def fn(p, x):
    h = x
    for s in p["s"]:
      h = jnp.tanh(h * s)
    return jnp.sum(jnp.mean(h, axis=0, keepdims=True) @ p["w"])
  return fn, params, batch


def _cut(traced, accumulation):
  info = autocut.cut_info(autocut.cut_to(traced, 2, cut="auto",
                                         cost="analytic",
                                         accumulation=accumulation))
  return info.positions[0], info.block_costs


def test_grad_bytes_charge_each_parameter_once_to_its_first_reader():
  fn, params, batch = _model()
  traced = trace(fn, "loss", params, batch)
  flat = autocut.flatten(traced)
  got = autocut_accum.grad_bytes(flat, len(traced.param_avals))
  assert got.sum() == 4 * (4 * WIDTH + WIDTH * OUT)
  reads_w = [i for i, e in enumerate(flat.jaxpr.eqns)
             if any(v is flat.jaxpr.invars[4] for v in e.invars)]
  assert got[reads_w[0]] == 4 * WIDTH * OUT


def test_a_sliced_parameter_adds_only_its_live_box():
  w = jnp.ones((3, 3, 8, 16))
  x = jnp.ones((4, 8))

  def fn(p, x):
    return jnp.sum(x @ p[1, 1])
  traced = trace(fn, "loss", w, x)
  flat = autocut.flatten(traced)
  assert autocut_accum.grad_bytes(flat, 1).sum() == 4 * 8 * 16


def test_cut_priced_with_the_adds_gives_the_weight_device_less():
  fn, params, batch = _model()
  traced = trace(fn, "loss", params, batch)
  plain, plain_costs = _cut(traced, False)
  priced, priced_costs = _cut(traced, True)
  # Without the adds the weight's block also takes elementwise layers
  # (the check can fail: it is where the cut lands on the old pricing).
  assert priced > plain, (plain, priced, plain_costs, priced_costs)
  n = len(autocut.flatten(traced).jaxpr.eqns)
  assert priced < n
  # Re-priced with the adds, the old cut is no better than the new one.
  eqn, _ = autocut.eqn_costs(autocut.flatten(traced), cost="analytic",
                             num_params=len(traced.param_avals),
                             accumulation=True)
  old = max(eqn[:plain].sum(), eqn[plain:].sum())
  new = max(eqn[:priced].sum(), eqn[priced:].sum())
  assert new <= old
  assert max(priced_costs) == pytest.approx(new, rel=1e-6)


def test_measured_add_rate_is_positive_and_finite():
  rate = autocut_accum.add_seconds_per_byte()
  assert np.isfinite(rate) and 0 < rate < 1e-6
  assert autocut_accum.seconds(np.array([3e9]), bandwidth=1e10)[0] == (
      pytest.approx(0.9))


def test_step_cut_passes_the_switch(monkeypatch):
  """``tessel_jax.step_cut.cut`` hands ``Switches.cut_accumulation`` to the
  automatic cut (off by default)."""
  import types

  from tessel_jax import step_cut
  from tessel_jax.passes.switches import Switches
  seen = []
  monkeypatch.setattr(step_cut._autocut, "cut_to",
                      lambda *a, **k: seen.append(k["accumulation"]))
  mesh = types.SimpleNamespace(devices=np.array([jax.devices()[0]]))
  for on in (False, True):
    step = types.SimpleNamespace(
        cut="auto", fn_name="f", cost="uniform", mode="train", mesh=mesh,
        _costs=types.SimpleNamespace(cache=None), num_microbatches=2,
        switches=Switches(cut_accumulation=on))
    step_cut.cut(step, types.SimpleNamespace(num_blocks=1), 2, "vshape", 2)
  assert seen == [False, True]
  assert not Switches().cut_accumulation
