"""experiments.peer_bench: the hand-written peers are correct; a tiny run."""

import json
import os
import subprocess
import sys

import jax
import numpy as np
import pytest

from experiments import lowering_bench_lib, peer_gpipe

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _mesh():
  return jax.make_mesh((2,), ("pipe",), devices=jax.devices()[:2],
                       axis_types=(jax.sharding.AxisType.Auto,))


def _close(a, b):
  for x, y in zip(jax.tree_util.tree_leaves(a), jax.tree_util.tree_leaves(b)):
    np.testing.assert_allclose(np.asarray(x), np.asarray(y), rtol=1e-5,
                               atol=1e-6)


@pytest.mark.parametrize("layers", [2, 4])
def test_hand_gpipe_equals_value_and_grad(layers):
  n = 4
  params = peer_gpipe.mlp_params(layers, 16)
  batch = lowering_bench_lib.make_batch(n * 4, 16)
  loss, grads = jax.value_and_grad(peer_gpipe.plain_loss(n))(params, batch)
  got_loss, got = peer_gpipe.gpipe_step(_mesh(), "pipe", n)(
      peer_gpipe.stack_stages(params, 2), batch)
  _close(loss, got_loss)
  _close(grads, peer_gpipe.unstack_stages(got))


def test_data_parallel_equals_value_and_grad():
  n = 4
  params = peer_gpipe.mlp_params(4, 16)
  batch = lowering_bench_lib.make_batch(n * 4, 16)
  want = jax.value_and_grad(peer_gpipe.plain_loss(n))(params, batch)
  got = peer_gpipe.data_parallel_step(_mesh(), "pipe", n)(params, batch)
  _close(want, got)


def test_peer_bench_smoke(tmp_path):
  """Every variant builds, is timed once and lands in the JSON and table."""
  out = tmp_path / "peer.json"
  env = dict(os.environ, TESSEL_JAX_CACHE=str(tmp_path / "cache"))
  env.pop("XLA_FLAGS", None)
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
