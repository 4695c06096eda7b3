"""``experiments.device_ticks`` on one CPU device at toy sizes: every
variant computes ``jax.value_and_grad``'s numbers, and the per-tick figures
are the difference to the gradient accumulation over the ticks."""

from __future__ import annotations

import pytest

from experiments import device_ticks_lib as lib

ARGS = lib.TicksArgs(width=32, rows=4, layers=2, ns=(2,), rounds=2,
                     ticks=16, branches=4, profile=False, output=None)


def test_every_variant_is_checked_and_priced_per_tick():
  got = lib.steps(ARGS, 2)
  rows = got["variants"]
  assert set(rows) == {"plain", "accumulate", *lib.TJ_VARIANTS}
  for name in lib.TJ_VARIANTS:
    row = rows[name]
    assert row["max_rel_err"] < 1e-5, (name, row)
    # Every layer a block of the one device: F and B per micro-batch.
    assert row["ticks"] == 2 * ARGS.layers * 2
    extra = row["median_ms"] - got["variants"]["accumulate"]["median_ms"]
    assert row["us_per_tick_over_accumulate"] == pytest.approx(
        extra * 1e3 / row["ticks"])
  assert rows["tj_compact"]["lowering"].startswith("lowering compact")
  assert rows["tj_loop"]["lowering"].startswith("lowering unrolled ramps")
  assert rows["accumulate"]["max_rel_err"] < 1e-5


def test_the_tick_floor_reports_the_switch_beyond_the_loop():
  got = lib.tick_floor(ARGS)
  per = got["us_per_iteration"]
  assert set(per) == {"loop", "loop+switch", "unrolled"}
  assert all(v > 0 for v in per.values())
  assert got["switch_us"] == pytest.approx(per["loop+switch"] - per["loop"])
