"""A forward block's jaxpr printed once for the kernel keys of its kernels
(``cost.kernel_keys._block_text``): its forward and backward kernels, and a
second profile of the same partition, reuse the text; the keys are those
of the text printed each time."""

from __future__ import annotations

import jax

from tessel_jax import compat
from tessel_jax.cost import kernel_keys, measure

import test_lowering_models as M


def _built():
  return M.uniform_chain_build(["embed", "layer", "head"], [0, 0, 1])


def _keys(built) -> dict[int, str]:
  avals = built.partition.traced.param_avals
  return {bid: measure.kernel_key(k, avals, jax.devices()[0],
                                  built.partition.blocks[k.fwd])
          for bid, k in built.kernels.kernels.items()}


def test_block_printed_once_for_all_its_kernels(monkeypatch):
  built = _built()
  printed = []
  real = compat.jaxpr_text

  def counted(eqns, invars, outvars):
    printed.append(1)
    return real(eqns, invars, outvars)
  monkeypatch.setattr(compat, "jaxpr_text", counted)
  monkeypatch.setattr(kernel_keys, "_BLOCK_TEXTS", {})
  kernels = built.kernels.kernels
  assert len(kernels) > len(built.partition.blocks)  # F and B per block
  _keys(built)
  assert len(printed) == len(built.partition.blocks)
  _keys(built)  # the same partition profiled again
  assert len(printed) == len(built.partition.blocks)


def test_keys_equal_the_text_printed_each_time(monkeypatch):
  built = _built()
  kept = _keys(built)
  monkeypatch.setattr(kernel_keys, "BLOCK_TEXTS_KEPT", 0)  # nothing reused
  monkeypatch.setattr(kernel_keys, "_BLOCK_TEXTS", {})
  fresh = {}
  for bid in kept:
    monkeypatch.setattr(kernel_keys, "_BLOCK_TEXTS", {})
    fresh[bid] = _keys(built)[bid]
  assert fresh == kept
  assert len(set(kept.values())) > 1


def test_kept_texts_bounded(monkeypatch):
  built = _built()
  monkeypatch.setattr(kernel_keys, "BLOCK_TEXTS_KEPT", 2)
  monkeypatch.setattr(kernel_keys, "_BLOCK_TEXTS", {})
  _keys(built)
  assert len(kernel_keys._BLOCK_TEXTS) <= 2  # pylint: disable=protected-access
