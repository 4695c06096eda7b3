"""experiments.peer_bench: the hand-written peers are correct; a tiny run."""

import json
import os
import subprocess
import sys

import jax
import numpy as np
import pytest

from experiments import lowering_bench_lib, peer_bench_lib, peer_gpipe

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _mesh(stages=2):
  return jax.make_mesh((stages,), ("pipe",), devices=jax.devices()[:stages],
                       axis_types=(jax.sharding.AxisType.Auto,))


def _close(a, b):
  for x, y in zip(jax.tree_util.tree_leaves(a), jax.tree_util.tree_leaves(b)):
    np.testing.assert_allclose(np.asarray(x), np.asarray(y), rtol=1e-5,
                               atol=1e-6)


@pytest.mark.parametrize("layers,stages", [(2, 2), (4, 2), (8, 4)])
def test_hand_gpipe_equals_value_and_grad(layers, stages):
  n = 4
  params = peer_gpipe.mlp_params(layers, 16)
  batch = lowering_bench_lib.make_batch(n * 4, 16)
  loss, grads = jax.value_and_grad(peer_gpipe.plain_loss(n))(params, batch)
  got_loss, got = peer_gpipe.gpipe_step(_mesh(stages), "pipe", n)(
      peer_gpipe.stack_stages(params, stages), batch)
  _close(loss, got_loss)
  _close(grads, peer_gpipe.unstack_stages(got))


@pytest.mark.parametrize("name,blocks", [
    ("tj_gpipe", [2, 2, 2, 2]), ("tj_mshape", [4, 1, 1, 1, 1]),
    ("tj_zbv", [1] * 8)])
def test_tessel_variants_pipeline_the_same_loss(name, blocks):
  """Every 4-stage tessel_jax variant gives each device 2 of the 8 layers
  per micro-batch, and its marked loss is the hand GPipe's plain loss."""
  placement, got_blocks = peer_bench_lib.tj_layout(name, 8, 4)
  assert got_blocks == blocks
  forwards = [b for b in placement.blocks if b.kind == "F"]
  assert len(forwards) == len(blocks)
  work = [0.0] * 4
  for b, layers in zip(forwards, blocks):
    for d in b.devices:
      work[d] += layers / len(b.devices)
  assert work == [2.0] * 4
  params = peer_gpipe.mlp_params(8, 16)
  batch = lowering_bench_lib.make_batch(8, 16)
  _close(jax.value_and_grad(peer_gpipe.plain_loss(1))(params, batch),
         jax.value_and_grad(peer_bench_lib.marked_loss(blocks))(params, batch))


def test_data_parallel_equals_value_and_grad():
  n = 4
  params = peer_gpipe.mlp_params(4, 16)
  batch = lowering_bench_lib.make_batch(n * 4, 16)
  want = jax.value_and_grad(peer_gpipe.plain_loss(n))(params, batch)
  got = peer_gpipe.data_parallel_step(_mesh(), "pipe", n)(params, batch)
  _close(want, got)


# The workers compile with the suite's fast-compile flags (tests/conftest.py),
# nothing else of the suite's XLA_FLAGS: the runner sets its own devices.
_SUITE_CODEGEN = peer_bench_lib.codegen_flags(
    os.environ.get("XLA_FLAGS", ""))


def test_peer_bench_smoke(tmp_path):
  """Every variant builds, is timed once and lands in the JSON and table."""
  out = tmp_path / "peer.json"
  env = dict(os.environ, TESSEL_JAX_CACHE=str(tmp_path / "cache"),
             XLA_FLAGS=_SUITE_CODEGEN)
  proc = subprocess.run(
      [sys.executable, "-m", "experiments.peer_bench", "--hidden=16",
       "--rows=4", "--ns=4", "--rounds=1", "--cost=uniform",
       f"--output={out}"], cwd=REPO, env=env, capture_output=True, text=True,
      check=False, timeout=600)
  assert proc.returncode == 0, proc.stderr[-3000:]
  record = json.loads(out.read_text())
  names = {b["variant"] for b in record["built"]}
  assert names == set(("plain_1core", "plain_2core", "data_parallel",
                       "hand_gpipe", "tj_searched", "tj_gpipe", "tj_1f1b",
                       "tj_compact"))
  compact = next(b for b in record["built"] if b["variant"] == "tj_compact")
  assert set(compact["hlo_breakdown"]["kernel_copies"].values()) == {1.0}
  assert all(b["temp_bytes"] >= 0 and
             0 < b["hlo_chars_no_metadata"] < b["hlo_chars"]
             for b in record["built"])
  assert record["summary"]["rows"]["hand_gpipe@4"]["vs_hand_gpipe"] == 1.0
  assert "MaxText" in (tmp_path / "peer.md").read_text()


def test_peer_bench_four_stages_smoke(tmp_path):
  """--stages=4: the hand GPipe and the searched mshape/zbv programs on 4
  fake devices, with the work ratio (CPU x hand GPipe) in the summary."""
  out = tmp_path / "peer4.json"
  env = dict(os.environ, TESSEL_JAX_CACHE=str(tmp_path / "cache"),
             XLA_FLAGS=_SUITE_CODEGEN)
  proc = subprocess.run(
      [sys.executable, "-m", "experiments.peer_bench", "--stages=4",
       "--hidden=16", "--rows=4", "--ns=4", "--rounds=1", "--cost=uniform",
       "--variants=hand_gpipe,tj_mshape,tj_zbv", f"--output={out}"],
      cwd=REPO, env=env, capture_output=True, text=True, check=False,
      timeout=600)
  assert proc.returncode == 0, proc.stderr[-3000:]
  record = json.loads(out.read_text())
  assert record["args"]["stages"] == 4 and record["args"]["layers"] == 8
  rows = record["summary"]["rows"]
  assert set(rows) == {"hand_gpipe@4", "tj_mshape@4", "tj_zbv@4"}
  assert rows["hand_gpipe@4"]["cpu_vs_hand_gpipe"] == 1.0
  assert all(r["cpu_vs_hand_gpipe"] > 0 for r in rows.values())
  assert "CPU x hand GPipe" in (tmp_path / "peer4.md").read_text()


def test_peer_bench_flags_say_what_is_wrong():
  proc = subprocess.run(
      [sys.executable, "-m", "experiments.peer_bench", "--stages=4",
       "--layers=4", "--output="], cwd=REPO, capture_output=True, text=True,
      check=False, timeout=120)
  assert proc.returncode != 0
  assert "--layers=4 must be a multiple of 8" in proc.stderr


def test_workers_inherit_only_the_codegen_flags():
  """A worker sets its own devices and threads; of the parent's XLA_FLAGS it
  keeps the code-generation flags alone (the suite's -O0, older emitters)."""
  flags = ("--xla_force_host_platform_device_count=8"
           " --xla_backend_optimization_level=0 --xla_cpu_multi_thread_eigen=false"
           " --xla_cpu_use_fusion_emitters=false")
  assert peer_bench_lib.codegen_flags(flags) == (
      "--xla_backend_optimization_level=0 --xla_cpu_use_fusion_emitters=false")
  assert peer_bench_lib.codegen_flags(
      "--xla_force_host_platform_device_count=8") == ""
