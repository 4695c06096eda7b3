"""The stash term of a classic schedule's price (``cost.stash_fill``,
``plan_pricing.baseline_price(stash_s_per_byte=)``): a schedule holding
more micro-batches than the searched plan whose stand-in priced its ticks
pays for the extra stash bytes every step (README GPT vshape pipe2 x dp2:
GPipe 3.2-9.2 MB more per device, 4-11% more CPU than priced). The price
itself: ``test_plans_baseline_ticks``."""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import pytest

from tessel_jax import plans as P
from tessel_jax.cost import stash_fill


def test_extra_seconds_is_the_largest_device_delta_on_shared_cores():
  per = 1e-9
  # Devices of their own pay side by side: the largest stash's delta once.
  assert stash_fill.extra_seconds((3_000, 5_000), (2_000, 1_000), per, 2,
                                  None) == pytest.approx(3_000 * per)
  # Two devices on one core pay it one after the other.
  assert stash_fill.extra_seconds((3_000, 5_000), (2_000, 1_000), per, 2,
                                  1.0) == pytest.approx(6_000 * per)
  # A smaller stash than the base's is cheaper; no stash, no term.
  assert stash_fill.extra_seconds((1_000,), (2_000,), per, 1, None) < 0
  assert stash_fill.extra_seconds((), (2_000,), per, 1, None) == 0.0


def test_measured_seconds_per_byte_is_finite_and_memoised():
  got = stash_fill.measure_seconds_per_byte(slots=4, slot_bytes=1 << 16,
                                            rounds=3)
  assert got >= 0 and math.isfinite(got)
  assert stash_fill.measure_seconds_per_byte(
      slots=4, slot_bytes=1 << 16, rounds=3) == got


def test_the_stash_term_is_part_of_what_keys_a_frontier(tmp_path):
  def fn(params, batch):
    return jnp.mean(batch @ params["w"])
  params, batch = {"w": jnp.ones((3, 2))}, jnp.ones((4, 3))
  mesh = jax.make_mesh((1,), ("pipe",))
  off, on = (P.FrontierFunction(fn, mesh=mesh, cost="measured",
                                cache_dir=str(tmp_path), price_stash=s)
             for s in (False, True))
  assert off.program_key(params, batch) != on.program_key(params, batch)
  traced = P.trace_markers(fn, params, batch, {})
  keys = [f._disk_key(traced, params, batch) for f in (off, on)]  # pylint: disable=protected-access
  assert None not in keys and keys[0][1] != keys[1][1]
