"""The model zoo's library on its tiniest models (the ``models`` extra).

Each test skips when its package is not installed. A row is either within
1e-5 of ``jax.value_and_grad`` (or of the plain function in inference) or
refused by a named rule; ``experiments.model_zoo`` runs the whole table.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest

from experiments import model_zoo_lib as Z
from experiments import model_zoo_models as ZM

ARGS = Z.ZooArgs(devices=4, microbatches=4, rows=4, repeats=1,
                 cost="uniform")


def _model(builder):
  return builder(ARGS.rows * ARGS.microbatches)


def _assert_ok(row):
  assert row["status"] == "ok", row.get("message", row)
  assert row["max_rel_err"] <= 1e-5
  assert row["step_s"] > 0 and row["plain_step_s"] > 0
  assert row["first_call_s"] >= row["step_s"]


@pytest.mark.parametrize("mode", ["train", "infer"])
def test_equinox_vmapped_mlp_on_vshape(mode):
  pytest.importorskip("equinox")
  row = Z.run_case(_model(ZM.eqx_mlp), "vshape", mode, ARGS)
  _assert_ok(row)
  assert [b["devices"] for b in row["blocks"]] == [[0], [1], [2], [3]]
  assert all(b["mode"] == "one device" for b in row["blocks"])


def test_flax_batchnorm_cnn_returns_running_stats_on_vshape():
  pytest.importorskip("flax")
  model = _model(ZM.nnx_bn_cnn)
  assert model.has_aux
  row = Z.run_case(model, "vshape", "train", ARGS)
  _assert_ok(row)


def test_shared_block_row_is_exact_or_refused_by_name():
  """mshape's block 0 is shared by 4 devices; the vmapped MLP either comes
  back exact or is refused with the rule that stops it."""
  pytest.importorskip("equinox")
  row = Z.run_case(_model(ZM.eqx_mlp), "mshape", "train", ARGS)
  if row["status"] == "refused":
    assert "block 0 runs on 4 devices" in row["message"]
  else:
    _assert_ok(row)
    assert row["blocks"][0]["devices"] == [0, 1, 2, 3]


def test_missing_package_is_recorded_not_raised(monkeypatch, tmp_path):
  def missing(rows):
    raise ImportError("No module named 'nothere'")
  monkeypatch.setitem(ZM.BUILDERS, "nothere", missing)
  args = ARGS._replace(models=("nothere",), placements=("vshape",),
                       modes=("train",), output_dir=str(tmp_path),
                       markdown=str(tmp_path / "zoo.md"))
  assert Z.main(args) == 0
  (path,) = tmp_path.glob("run_*.json")
  rows = json.loads(path.read_text())["rows"]
  assert rows[0]["status"] == "skipped"
  assert "pip install -e '.[models]'" in rows[0]["message"]
  table = (tmp_path / "zoo.md").read_text()
  assert "| nothere | vshape | train | skipped |" in table


def test_relative_error_floor_and_structure():
  want = {"big": np.array([1.0, -2.0]), "tiny": np.array([1e-9])}
  got = {"big": np.array([1.0, -2.0]), "tiny": np.array([3e-9])}
  assert Z.max_rel_err(got, want) == pytest.approx(2e-9 / (2.0 * Z.FLOOR))
  assert Z.max_rel_err(got, want, floor=0.0) == pytest.approx(2.0)
  with pytest.raises(ValueError, match="structure"):
    Z.max_rel_err({"big": want["big"]}, want)


def test_binary_rejects_unknown_models():
  root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
  out = subprocess.run(
      [sys.executable, "-m", "experiments.model_zoo", "--models=nope"],
      cwd=root, capture_output=True, text=True, timeout=120, check=False)
  assert out.returncode != 0
  assert "--models: unknown ['nope']" in out.stderr + out.stdout
