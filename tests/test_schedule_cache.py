"""Searched schedules cached on disk; progress lines on the tessel_jax
logger."""

from __future__ import annotations

import json
import logging

import jax
import jax.numpy as jnp
import numpy as np

import tessel_jax as tj
from experiments import lowering_bench_lib
from tessel_jax import placements, progress, schedule_cache

N = 6
ROWS = 4


def _step(tmp_path, **kw):
  fn, params = lowering_bench_lib.chain_model(2, 16, 1)
  batch = lowering_bench_lib.make_batch(N * ROWS, 16)
  mesh = jax.make_mesh((2,), ("pipe",), devices=jax.devices()[:2])
  step = tj.schedule(fn, mesh=mesh, placement=placements.vshape(2),
                     num_microbatches=N, cost="uniform",
                     cache_dir=str(tmp_path), **kw)
  return step, fn, params, batch


def _check(step, fn, params, batch):
  loss, grads = step(params, batch)
  ref = jax.value_and_grad(lambda p: jnp.mean(jnp.stack([
      fn(p, jax.tree_util.tree_map(lambda x: x[i * ROWS:(i + 1) * ROWS],
                                   batch)) for i in range(N)])))(params)
  np.testing.assert_allclose(loss, ref[0], rtol=1e-5)
  for a, b in zip(jax.tree_util.tree_leaves(grads),
                  jax.tree_util.tree_leaves(ref[1])):
    np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


def _records(tmp_path):
  return sorted(tmp_path.glob(f"{schedule_cache.KIND}-*.json"))


def test_second_build_reuses_the_searched_schedule(tmp_path):
  first, fn, params, batch = _step(tmp_path)
  _check(first, fn, params, batch)
  assert first.searches == 1 and first.schedule_cache_hits == 0
  assert len(_records(tmp_path)) == 1
  second, *_ = _step(tmp_path)                  # as a second process would
  _check(second, fn, params, batch)
  assert second.searches == 0 and second.schedule_cache_hits == 1
  assert second.unrolled.actions == first.unrolled.actions
  assert second.schedule.repetend == first.schedule.repetend
  assert second.schedule.period == first.schedule.period
  # Other search options are another key: searched again.
  third, *_ = _step(tmp_path, seed=1)
  third.build(params, batch)
  assert third.searches == 1 and len(_records(tmp_path)) == 2


def test_an_invalid_record_is_searched_again(tmp_path):
  first, fn, params, batch = _step(tmp_path)
  first.build(params, batch)
  (path,) = _records(tmp_path)
  record = json.loads(path.read_text())
  # Start every action at 0: dependencies and device overlaps break.
  for a in record["unrolled"]["actions"]:
    a["start"] = 0
  path.write_text(json.dumps(record))
  again, *_ = _step(tmp_path)
  _check(again, fn, params, batch)
  assert again.searches == 1 and again.schedule_cache_hits == 0
  path.write_text("{not json")
  garbled, *_ = _step(tmp_path)
  garbled.build(params, batch)
  assert garbled.searches == 1


def test_progress_lines_one_per_phase(tmp_path, caplog):
  step, fn, params, batch = _step(tmp_path)
  assert not any(getattr(h, "_tessel_jax", False)
                 for h in progress.LOGGER.handlers)   # quiet by default
  with caplog.at_level(logging.INFO, logger="tessel_jax"):
    step(params, batch)
  lines = [r.getMessage() for r in caplog.records if r.name == "tessel_jax"]
  for phase in ("trace", "cut", "kernels", "search", "lower", "compile"):
    assert any(f"schedule('mlp_loss'): {phase} " in l for l in lines), lines
  assert any("XLA compile" in l for l in lines), lines
  caplog.clear()
  with caplog.at_level(logging.INFO, logger="tessel_jax"):
    step(params, batch)                          # built and compiled: silent
  assert not [r for r in caplog.records if r.name == "tessel_jax"]


def test_verbose_shows_the_lines_on_stderr(tmp_path):
  try:
    _step(tmp_path, verbose=True)
    handlers = [h for h in progress.LOGGER.handlers
                if getattr(h, "_tessel_jax", False)]
    assert len(handlers) == 1
    assert progress.LOGGER.getEffectiveLevel() <= logging.INFO
    _step(tmp_path, verbose=True)                # added once only
    assert len([h for h in progress.LOGGER.handlers
                if getattr(h, "_tessel_jax", False)]) == 1
  finally:
    for h in list(progress.LOGGER.handlers):
      if getattr(h, "_tessel_jax", False):
        progress.LOGGER.removeHandler(h)
    progress.LOGGER.setLevel(logging.NOTSET)
