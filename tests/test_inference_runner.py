"""experiments.inference on a tiny GPT (8 fake CPU devices from conftest)."""

from __future__ import annotations

import os
import subprocess
import sys

import jax
import numpy as np
import pytest

from experiments import gpt_profile, inference_lib, inference_plot, runs

SHAPE = gpt_profile.GPTShape(vocab=64, d_model=16, layers=2, heads=2, seq=8,
                             rows=4)


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
  """One profile cache for the module: later runs reuse the measurements."""
  return str(tmp_path_factory.mktemp("profile_cache"))


def _args(tmp_path, **kw) -> inference_lib.InferenceArgs:
  base = dict(placements=("vshape", "kshape"),
              devices=2, microbatches=(2,), vocab=SHAPE.vocab,
              d_model=SHAPE.d_model, layers=SHAPE.layers, heads=SHAPE.heads,
              seq=SHAPE.seq, rows=SHAPE.rows, repeats=1, time_limit=2.0,
              profile_rounds=1,
              output_dir=str(tmp_path))
  base.update(kw)
  return inference_lib.InferenceArgs(**base)


def test_model_functions_agree_across_placements():
  # Chain, towers (X-shape) and branches (K-shape) compute the same
  # per-sequence scores; tj.boundary is the identity outside tj.schedule.
  params = gpt_profile.init_params(SHAPE)
  batch = gpt_profile.make_batch(SHAPE, SHAPE.rows)
  n = len(gpt_profile.layer_names(SHAPE))
  fns = [gpt_profile.chain_fn(SHAPE, [(0, n)], "nll"),
         gpt_profile.model_fn("xshape", SHAPE, [(0, 1), (1, n)], "nll"),
         gpt_profile.model_fn("kshape", SHAPE, [(0, 2), (2, n)], "nll")]
  want, *got = jax.jit(lambda p, b: [f(p, b) for f in fns])(params, batch)
  assert want.shape == (SHAPE.rows,)
  for g in got:
    np.testing.assert_allclose(g, want, rtol=1e-5, atol=1e-6)
  with pytest.raises(ValueError, match="cover layers"):
    gpt_profile.chain_fn(SHAPE, [(0, 1), (2, n)])


def test_inference_runner(tmp_path, cache):
  lines = []
  results = inference_lib.run(_args(tmp_path, cache_dir=cache),
                              log=lines.append)
  assert os.path.exists(results["output"])
  data = runs.read(results["output"])
  assert data["runner"] == "inference"
  assert [l["name"] for l in data["model"]["layers"]] == (
      gpt_profile.layer_names(SHAPE))
  rows = {r["placement"]: r for r in data["rows"]}
  assert set(rows) == {"vshape", "kshape"}
  for name, r in rows.items():
    assert "error" not in r and "measure_error" not in r, (name, r)
    assert r["max_rel_err"] <= 1e-5
    assert r["predicted_ms"] > 0 and r["dedicated_ms"] > 0
    assert r["measured_ms"] > 0
    assert r["measured_throughput"] == pytest.approx(
        2 * SHAPE.rows / r["measured_ms"] * 1e3, rel=1e-3)
  assert data["plain_ms"]["2"] > 0
  # Every other placement is compared with the V-shape.
  changes = {c["placement"]: c for c in data["changes"]}
  assert set(changes) == {"kshape"}
  for name, c in changes.items():
    v, r = rows["vshape"]["predicted_ms"], rows[name]["predicted_ms"]
    assert c["predicted_ms"] == pytest.approx(100 * (r - v) / v, abs=0.01)
  text = inference_lib.summary(data)
  assert "change vs vshape" in text and "| kshape |" in text
  pictures = inference_plot.plot_file(results["output"])
  assert all(os.path.getsize(p) > 0 for p in pictures)


def test_inference_runner_predictions_only(tmp_path, cache):
  results = inference_lib.run(
      _args(tmp_path, placements=("vshape", "mshape"), measure=False,
            cache_dir=cache),
      log=lambda s: None)
  for r in results["rows"]:
    assert "measured_ms" not in r and r["predicted_ms"] > 0
  assert [c["placement"] for c in results["changes"]] == ["mshape"]
  assert "predicted_ms" in results["changes"][0]


def test_inference_arguments(tmp_path):
  with pytest.raises(ValueError, match="must include 'vshape'"):
    inference_lib.check_args(_args(tmp_path, placements=("mshape",)))
  with pytest.raises(ValueError, match="rows 6 must divide"):
    inference_lib.check_args(_args(tmp_path, rows=6, devices=4))
  with pytest.raises(ValueError, match="choose from"):
    inference_lib.check_args(_args(tmp_path,
                                   placements=("vshape", "alphafold")))
  with pytest.raises(ValueError, match="devices needed"):
    inference_lib.run(_args(tmp_path, devices=len(jax.devices()) + 2,
                            rows=4 * (len(jax.devices()) + 2)))


def test_inference_binary_checks_its_flags(tmp_path):
  proc = subprocess.run(
      [sys.executable, "-m", "experiments.inference", "--placements=mshape",
       f"--output_dir={tmp_path}"], capture_output=True, text=True,
      timeout=120)
  assert proc.returncode != 0
  assert "must include 'vshape'" in proc.stderr
