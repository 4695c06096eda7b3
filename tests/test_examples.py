"""Every script in examples/ runs as a user would run it (fresh process).

Each runs on CPU with no device count in ``XLA_FLAGS`` (the scripts make
their own devices with ``tj.cpu_mesh``; ``child_env``) and uniform costs, in a temporary directory. Scripts
needing optional packages (flax, optax, orbax) are skipped without them
(``pip install -e '.[models]'``).
"""

from __future__ import annotations

import pathlib
import subprocess
import sys

import pytest
from child_env import child_env

ROOT = pathlib.Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "examples"

# script -> optional modules it imports.
NEEDS = {
    "gpt_markers.py": (),
    "flax_autocut.py": ("flax",),
    "train_optax.py": ("optax", "orbax.checkpoint"),
    "inference.py": (),
}


def _run(script: str, *args: str, cwd: pathlib.Path) -> str:
  env = child_env(TESSEL_JAX_COST="uniform", MPLBACKEND="Agg",
                  PYTHONPATH=str(ROOT))
  proc = subprocess.run([sys.executable, str(EXAMPLES / script), *args],
                        cwd=cwd, env=env, capture_output=True, text=True,
                        timeout=600, check=False)
  assert proc.returncode == 0, f"{script} failed:\n{proc.stderr[-4000:]}"
  return proc.stdout


def test_every_example_is_listed():
  assert {p.name for p in EXAMPLES.glob("*.py")} == set(NEEDS)


@pytest.mark.parametrize("script", ["gpt_markers.py", "flax_autocut.py",
                                    "inference.py"])
def test_example_runs(script, tmp_path):
  for module in NEEDS[script]:
    pytest.importorskip(module)
  out = _run(script, cwd=tmp_path)
  assert "dev0" in out              # printed the schedule grid
  assert "error" in out or "difference" in out


def test_training_example_checkpoints_and_resumes(tmp_path):
  for module in NEEDS["train_optax.py"]:
    pytest.importorskip(module)
  first = _run("train_optax.py", "ckpt", cwd=tmp_path)
  assert "step 5: loss" in first
  assert (tmp_path / "ckpt" / "6").is_dir()
  second = _run("train_optax.py", "ckpt", cwd=tmp_path)
  assert "resumed from step 6" in second
