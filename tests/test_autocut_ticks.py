"""The measured automatic cut prices convolutions as the ticks run them
(``passes.autocut_ticks``).

A 3x3 convolution on a 2x2 map costs ~2 ms forward + backward compiled
alone at the top of a program (XLA swaps its operands into a generic loop)
and ~0.3 ms in a tick, where ``passes.conv_forms`` runs it as one dot. The
cut priced at the top level put one of two such convolutions on each
device of a 2-block cut, against the two 8x8 convolutions after them; priced
as the ticks run them, both go to block 0 and the 8x8 ones to block 1
(ResNet18: its stage-2 blocks, cut after basic block 3 instead of 2).
"""

from __future__ import annotations

import numpy as np

try:
  from tessel_jax.passes import autocut, autocut_cost
  from tessel_jax.passes.tracing import trace
except ImportError:  # run from the repository root
  from passes import autocut, autocut_cost
  from passes.tracing import trace

import conv_models

# Units (equations) of conv_models.swapped_then_canonical: the second small
# convolution is unit 2, the first big one unit 6.
SECOND_SMALL, FIRST_BIG = 2, 6


def _cut(traced, costs):
  return autocut.cut_info(autocut.cut_to(traced, 2, cut="auto", cost=costs)
                          ).positions[0]


def test_measured_cut_prices_convolutions_as_the_ticks_run_them():
  fn, params, batch = conv_models.swapped_then_canonical()
  traced = trace(fn, "loss", params, batch, dead_taps=True)
  flat = autocut.flatten(traced)
  per_step = autocut.hoisted_eqns(flat, len(traced.param_avals))
  fast = {"repeats": 3, "min_seconds": 0.002}
  top = autocut_cost.measured_costs(flat, train=True, per_step=per_step,
                                    **fast)
  ticks = autocut_cost.measured_costs(
      flat, train=True, per_step=per_step, ticks=True, conv_forms=True,
      num_params=len(traced.param_avals), **fast)
  small = [ticks.seconds[0], ticks.seconds[SECOND_SMALL]]
  assert top.seconds[0] > 2.5 * ticks.seconds[0], (top.seconds, small)
  # Top level: the swapped convolutions dominate, one per block (the
  # check can fail: it is where the old pricing cut).
  assert _cut(traced, top.seconds) <= SECOND_SMALL, top.seconds
  # As the ticks run them: both small ones in block 0, the big ones in 1.
  got = autocut.cut_info(autocut.cut_to(
      traced, 2, cut="auto", cost="measured", conv_forms=True)).positions[0]
  assert SECOND_SMALL < got <= FIRST_BIG, (got, ticks.seconds)
  assert SECOND_SMALL < _cut(traced, ticks.seconds) <= FIRST_BIG
  assert np.all(np.isfinite(ticks.seconds))
