"""experiments.inference_speedup: its programs agree, its summary pairs rounds."""

from __future__ import annotations

import jax
import numpy as np

from experiments import gpt_profile
from experiments import inference_speedup_lib as lib

TINY = lib.SpeedupArgs(vocab=64, d_model=16, layers=2, heads=2, seq=4,
                       rows=4, microbatches=2, profile_rounds=1)


def test_pipelined_programs_equal_the_plain_batch():
  run, _ = lib.plain_program(TINY)
  want = np.asarray(run())
  assert want.shape == (TINY.microbatches * TINY.rows,)
  model = gpt_profile.profile_layers(lib.shape_of(TINY), mode="infer")
  mesh = jax.sharding.Mesh(np.array(jax.devices()[:2]), ("pipe",))
  for name in ("xshape",):
    pipe, row = lib.pipe_program(name, TINY, model, mesh)
    got = np.asarray(pipe())
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    assert row["predicted_ms"] > 0 and row["lowered_as"]
    assert "collective-permute" in row["hlo"]   # the worker profiles it


def _round(quiet: bool, plain1: float, plain2: float, pipe: float) -> dict:
  t = lambda w: {"wall_s": w, "cpu_s": w / 2, "others_cores": 0.0}
  return {"quiet": quiet, "times": {"plain_1core": t(plain1),
                                    "plain_2core": t(plain2),
                                    "vshape": t(pipe)}}


def test_summary_keeps_quiet_rounds_and_pairs_ratios():
  rounds = [_round(True, 1.0, 0.8, 0.5), _round(False, 9.0, 9.0, 1.0),
            _round(True, 2.0, 1.0, 0.5)]
  s = lib.summarise(rounds, ["plain_1core", "plain_2core", "vshape"])
  assert s["rounds_kept"] == 2 and not s["kept_busy_rounds"]
  row = s["rows"]["vshape"]
  assert row["vs_plain_1core"] == 0.375     # median of 0.5 and 0.25
  assert row["vs_plain_2core"] == 0.562     # median of 0.625 and 0.5
  assert row["wall_ms"] == 500.0 and row["cpu_ms"] == 250.0
  busy = lib.summarise(rounds[1:2], ["plain_1core", "vshape"])
  assert busy["kept_busy_rounds"] and busy["rows"]["vshape"]["wall_ms"] == 1000
  table = lib.markdown([{"variant": "vshape", "predicted_ms": 400.0,
                         "lowered_as": "loop(4x1)", "max_rel_err": 0.0}], s)
  assert ("| vshape | loop(4x1) | 500.0 | 250.0 | 0.375 | 0.562 | 400.0 |"
          " 1.25 | 0.0e+00 |") in table
