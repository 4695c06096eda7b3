"""Kernels doing the same work share one abstract trace for their hoisted
bytes (``passes.hoist.predicted_bytes`` with ``keys``).

``placement="auto"`` prices plans of several placements cut into the same
blocks: each has its own kernel set, but kernels with equal profile keys
(``cost.measure.kernel_key``) trace alike, so their hoisted bytes come
from one trace.
"""

from __future__ import annotations

import jax

import tessel_jax as tj
from tessel_jax import placements
from tessel_jax.cost import measure
from tessel_jax.passes import hoist

from test_hoist import N, conv_model


def _build():
  fn, params, batch = conv_model()
  mesh = jax.make_mesh((2,), ("pipe",), devices=jax.devices()[:2])
  step = tj.schedule(fn, mesh=mesh, placement=placements.vshape(2),
                     num_microbatches=N, cut="markers", cost="uniform")
  built = step.build(params, batch)
  avals = built.partition.traced.param_avals
  keys = {bid: measure.kernel_key(k, avals, jax.devices()[0],
                                  built.partition.blocks[k.fwd])
          for bid, k in built.kernels.kernels.items()}
  return built, avals, keys


def test_equal_keys_share_one_trace(monkeypatch):
  first, avals, keys1 = _build()
  second, _, keys2 = _build()
  assert keys1 == keys2
  assert first.kernels is not second.kernels
  traced = []
  real = hoist._trace_abstract  # pylint: disable=protected-access
  monkeypatch.setattr(hoist, "_trace_abstract",
                      lambda k, pv, dv: traced.append(k) or real(k, pv, dv))
  monkeypatch.setattr(hoist, "_SHARED_TRACES", type(hoist._SHARED_TRACES)())  # pylint: disable=protected-access

  def nbytes(built, keys):
    return hoist.predicted_bytes(built.kernels.kernels, built.layout, avals,
                                 N, keys=keys)
  alone = nbytes(second, None)          # per kernel (the build's memo)
  assert alone == 2 * 9 * 8 * 8 * 4     # the two reversed conv weights
  assert nbytes(first, keys1) == alone
  shared = len(traced)
  assert 0 < shared <= len(first.kernels.kernels)  # at most one a kernel
  assert nbytes(second, keys2) == alone
  assert len(traced) == shared          # the second kernel set: no trace


def test_lowering_reuses_the_builds_own_traces(monkeypatch):
  """A kernel traced for its hoisted bytes (a shared-memo miss) is not
  traced again by the step program's lowering (``hoist.prepare``, no
  profile keys); a kernel whose bytes came from another kernel set's trace
  (a hit) is traced by the lowering itself."""
  first, avals, keys1 = _build()
  second, _, keys2 = _build()
  monkeypatch.setattr(hoist, "_SHARED_TRACES", type(hoist._SHARED_TRACES)())  # pylint: disable=protected-access
  monkeypatch.setattr(hoist, "_TRACES", type(hoist._TRACES)())  # pylint: disable=protected-access
  traced = []
  real = hoist._trace_abstract  # pylint: disable=protected-access
  monkeypatch.setattr(hoist, "_trace_abstract",
                      lambda k, pv, dv: traced.append(k) or real(k, pv, dv))
  for built, keys in ((first, keys1), (second, keys2)):
    hoist.predicted_bytes(built.kernels.kernels, built.layout, avals, N,
                          keys=keys)
  by_build = list(traced)
  assert by_build and all(k in first.kernels.kernels.values()
                          for k in by_build)   # second: every one a hit
  fn, params, batch = conv_model()
  del traced[:]
  first.jitted.lower(params, batch)
  assert traced == []                   # first's own traces reused
  second.jitted.lower(params, batch)
  assert sorted(map(id, traced)) == sorted(
      id(second.kernels.kernels[kid]) for kid, k in first.kernels.kernels.items()
      if k in by_build)                 # hits: traced by the lowering
