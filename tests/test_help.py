"""``python -m experiments.<runner> --help`` exits 0 and lists its flags.

Every runner (a module of experiments/ that calls ``cli.run``) is asked for
help in a fresh process; the output must show the runner's docstring and,
for runners with flags, at least one flag of its ``*_args`` module with its
help text, and the process must not have imported jax, CP-SAT or matplotlib
(a single-file runner's work lives in its ``*_lib`` module, which its
``main`` imports).
"""

from __future__ import annotations

import ast
import os
import pathlib
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
RUNNERS = sorted(p.stem for p in (ROOT / "experiments").glob("*.py")
                 if "\n  cli.run(main)" in p.read_text())


#: Packages a runner's ``--help`` must not import (a second or more of CPU
#: each: help is asked in a fresh process per runner).
HEAVY = ("jax", "ortools", "matplotlib")


def _imported(importtime: str) -> set[str]:
  """Top-level packages named in ``python -X importtime``'s log."""
  return {line.rsplit("|", 1)[1].strip().split(".")[0]
          for line in importtime.splitlines()
          if line.startswith("import time:") and line.count("|") == 2}


def _own_flag(runner: str) -> tuple[str, str] | None:
  """A flag defined by the runner's ``*_args`` module: (name, help).

  Read from the source (importing several ``*_args`` modules into one
  process would define clashing flags).
  """
  path = ROOT / "experiments" / f"{runner}_args.py"
  if not path.exists():
    return None
  for node in ast.walk(ast.parse(path.read_text())):
    if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
        and node.func.attr.startswith("DEFINE_") and len(node.args) >= 3
        and isinstance(node.args[0], ast.Constant)
        and isinstance(node.args[2], ast.Constant)):
      return node.args[0].value, node.args[2].value
  raise AssertionError(f"experiments/{runner}_args.py defines no flags")


def _docstring(runner: str) -> str:
  path = ROOT / "experiments" / f"{runner}.py"
  return ast.get_docstring(ast.parse(path.read_text()))


def test_every_binary_is_a_runner():
  binaries = sorted(p.stem for p in (ROOT / "experiments").glob("*.py")
                    if 'if __name__ == "__main__":' in p.read_text())
  assert binaries == RUNNERS
  assert len(RUNNERS) >= 10


@pytest.mark.parametrize("runner", RUNNERS)
def test_help_lists_own_flags(runner):
  env = dict(os.environ, JAX_PLATFORMS="cpu")
  proc = subprocess.run([sys.executable, "-X", "importtime", "-m",
                         f"experiments.{runner}", "--help"], cwd=ROOT,
                        env=env, capture_output=True, text=True, timeout=300,
                        check=False)
  assert proc.returncode == 0, proc.stdout + proc.stderr
  heavy = sorted(_imported(proc.stderr) & set(HEAVY))
  assert not heavy, f"{runner}'s --help imports {heavy}"
  assert _docstring(runner).splitlines()[0] in proc.stdout
  own = _own_flag(runner)
  if own is not None:
    name, text = own
    assert f"--{name}" in proc.stdout, proc.stdout
    assert text.split()[0] in proc.stdout


def test_comparisons_read_as_shorter_or_longer():
  from experiments import compare_schedules_lib as lib  # pylint: disable=import-outside-toplevel
  assert lib.versus("tessel", 83, "zb_h1", 89) == (
      "tessel 83 steps vs zb_h1 89 (7% shorter)")
  assert lib.versus("tessel", 95, "gpipe", 89).endswith("89 (7% longer)")
  assert lib.versus("tessel", 89, "1f1b", 89).endswith("89 (equal)")


def test_runners_hide_the_backend_probe():
  code = ("from experiments import cli\n"
          "def main(argv):\n"
          "  import jax\n"
          "  print(len(jax.devices()))\n"
          "cli.run(main)\n")
  env = {k: v for k, v in os.environ.items() if k != "JAX_PLATFORMS"}
  proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env,
                        capture_output=True, text=True, timeout=300,
                        check=False)
  assert proc.returncode == 0, proc.stderr
  assert "Unable to initialize backend" not in proc.stderr


def test_lib_modules_define_no_flags():
  # Only a runner's ``*_args`` module (imported by its binary alone)
  # defines absl flags; a ``*_lib`` module is imported by tests and other
  # runners, where its flags would clash (DuplicateFlagError at import).
  libs = sorted(p.stem for p in (ROOT / "experiments").glob("*_lib.py"))
  script = (
      "import importlib, sys\n"
      "from absl import app, flags, logging  # their own flags\n"
      "before = set(flags.FLAGS)\n"
      "for name in sys.argv[1:]:\n"
      "  importlib.import_module('experiments.' + name)\n"
      "  new = sorted(set(flags.FLAGS) - before)\n"
      "  assert not new, (name, new)\n")
  env = dict(os.environ, JAX_PLATFORMS="cpu")
  proc = subprocess.run([sys.executable, "-c", script, *libs], cwd=ROOT,
                        env=env, capture_output=True, text=True,
                        timeout=300, check=False)
  assert proc.returncode == 0, proc.stderr[-2000:]
  assert len(libs) >= 10
