"""One loop body per distinct kernel in the compact lowering.

The README GPT on mshape(4) (smaller here): its forward kernels of the
one-layer blocks F1-F3 (devices 0-2) are the same computation, and so are
some of their backward kernels; ``Switches.distinct_kernels`` lowers each
such group as one 0/1-trip loop (``passes.kernel_groups``). The program
must hold one kernel body per distinct kernel (the kernel scopes named in
the compiled HLO are the groups' representatives, one copy each) and equal
``jax.value_and_grad``; with the switch off every kernel has its own body.
"""

from __future__ import annotations

import os
from typing import Any

import jax
import numpy as np
import pytest

import tessel_jax as tj
from experiments import hlo_count, train_lib
from tessel_jax import placements
from tessel_jax.passes import kernel_groups, switches

import test_lowering_models as M
from conftest import OLDER_EMITTERS

N = 4
LAYERS = 4
HEADS = 2
TEXT = "the quick brown fox jumps over the lazy dog. " * 20


def _setup():
  data = train_lib.CharData(TEXT, 8, 0)
  params = train_lib.init_params(0, data.vocab, 16, LAYERS, 8)
  batch = data.batch(N * 2)
  fn = train_lib.make_loss_fn(LAYERS + 1, LAYERS, HEADS)
  return fn, params, batch


def _step(fn, on: bool):
  mesh = jax.make_mesh((4,), ("pipe",), devices=jax.devices()[:4])
  return tj.schedule(fn, mesh=mesh, placement=placements.mshape(4),
                     num_microbatches=N, cost="uniform", interpret_ramps=0,
                     switches=switches.Switches(distinct_kernels=on))


@pytest.fixture(scope="module")
def gpt():
  fn, params, batch = _setup()
  ref = M.reference(fn, params, batch, N, jit=True)
  return fn, params, batch, ref


def _run(fn, on: bool, params, batch
         ) -> tuple[Any, Any, dict[int, int], str]:
  """``(step, outputs, representatives, compiled HLO text)`` of a fresh step:
  ``kernel_groups.representatives`` of its interp segment as the lowering
  computed them (spied; empty with the switch off)."""
  seen: dict[int, int] = {}
  real = kernel_groups.representatives

  def spy(low, spec, pbuf):
    seen.update(real(low, spec, pbuf))
    return dict(seen)

  kernel_groups.representatives = spy
  try:
    step = _step(fn, on)
    out = step(params, batch)
    text = step.lower(params, batch).compile().as_text()
  finally:
    kernel_groups.representatives = real
  return step, out, seen, text


@pytest.fixture(scope="module")
def runs(gpt):
  """``{on: _run(...)}`` for the switch on and off: each program built and
  compiled once for the module (the equality and body tests read both)."""
  fn, params, batch, _ = gpt
  return {on: _run(fn, on, params, batch) for on in (True, False)}


@pytest.mark.parametrize("on", [True, False], ids=["distinct", "per_kernel"])
def test_equals_value_and_grad(gpt, runs, on):
  _, _, _, (ref_loss, ref_grads) = gpt
  _, (loss, grads), _, _ = runs[on]
  assert M.max_rel_err(loss, ref_loss) <= 1e-5
  assert M.max_rel_err(grads, ref_grads) <= 1e-5


def test_identical_kernels_have_one_body(runs):
  on, out_on, rep, text = runs[True]
  _, out_off, none, text_off = runs[False]
  # The same computations in another program: bit-equal under XLA's MLIR
  # fusion emitters (its default); the older emitters the suite compiles
  # with (tests/conftest.py) fuse and round the two programs differently
  # (max relative error 8.1e-7 against 0.0), so there equal to rounding.
  if OLDER_EMITTERS in os.environ.get("XLA_FLAGS", "").split():
    assert M.max_rel_err(out_on, out_off) <= 5e-6
  else:
    for a, b in zip(jax.tree_util.tree_leaves(out_on),
                    jax.tree_util.tree_leaves(out_off)):
      np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
  assert not none  # off: no grouping asked
  kernels = on.built.plan.kernels
  assert {s.kind for s in on.built.plan.segments} == {"interp"}
  kid = {k.label: i for i, k in kernels.items()}
  labels = {kernels[k].label: kernels[r].label for k, r in rep.items()}
  # F1-F3 (one layer each, devices 0-2) are one body; F4 (the last layer
  # and the tied head) and F0 (the embedding, on every device) are not.
  assert labels["F2"] == labels["F3"] == "F1", labels
  assert labels["F4"] == "F4" and labels["F0"] == "F0", labels
  # B2, B3 send their input cotangent on to the next device; B1 sends its
  # to B0 on every device (other rounds: kernel_groups._rounds).
  assert labels["B2"] == labels["B3"], labels
  assert labels["B4"] == "B4" and labels["B0"] == "B0", labels
  distinct = set(rep.values())
  assert len(distinct) < len(kernels)
  # Only the representatives' bodies are in the program, each as often as
  # with a body per kernel (once); off, every kernel has its own.
  heavy, heavy_off = (hlo_count.kernel_heavy_ops(t) for t in (text, text_off))
  merged = {k for k in kernels if rep[k] != k}
  assert merged & set(heavy_off)  # kernels with dots among the merged
  assert set(heavy) == set(heavy_off) - merged, labels
  assert {k: heavy[k] for k in set(heavy)} == {k: heavy_off[k]
                                               for k in set(heavy)}
  assert heavy[kid["F1"]] == heavy_off[kid["F2"]] == heavy_off[kid["F3"]]


def test_distinct_kernels_is_the_default_and_the_environment_turns_it_off():
  assert switches.Switches().distinct_kernels
  assert switches.from_env({}).distinct_kernels
  assert not switches.from_env(
      {switches.DISTINCT_KERNELS_ENV: "0"}).distinct_kernels


def test_captured_prng_keys_are_compared_by_their_key_data():
  """A kernel that closes over a typed PRNG key (dropout) gets a constants
  digest (NumPy cannot convert a key array: the lowering raised on it), and
  kernels drawing from different keys do not share a body."""
  def closed_over(seed: int) -> Any:
    key = jax.random.key(seed)
    return jax.make_jaxpr(
        lambda x: x * jax.random.bernoulli(key, 0.5, x.shape))(np.ones(4))

  same = [kernel_groups._consts_digest(closed_over(s)) for s in (7, 7)]
  other = kernel_groups._consts_digest(closed_over(8))
  assert same[0] == same[1] and same[0]
  assert other != same[0]
