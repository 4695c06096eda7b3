"""tests/cpu_log.py: one line per test with its CPU and wall seconds."""

from __future__ import annotations

import os
import pathlib
import subprocess
import sys

import cpu_log

HERE = pathlib.Path(__file__).resolve().parent

_INNER = '''
import subprocess, sys, time

def test_busy():
  end = time.process_time() + 0.3
  while time.process_time() < end:
    pass

def test_sleeps():
  time.sleep(0.3)

def test_child_busy():
  subprocess.run([sys.executable, "-c",
                  "import time\\nend = time.process_time() + 0.3\\n"
                  "while time.process_time() < end: pass"], check=True)
'''


def _run_inner(tmp_path: pathlib.Path, log: str | None) -> None:
  (tmp_path / "test_inner.py").write_text(_INNER)
  env = {k: v for k, v in os.environ.items()
         if k not in (cpu_log.ENV, "PYTEST_XDIST_WORKER")}
  env["PYTHONPATH"] = os.pathsep.join([str(HERE), env.get("PYTHONPATH", "")])
  if log is not None:
    env[cpu_log.ENV] = log
  proc = subprocess.run(
      [sys.executable, "-m", "pytest", "-q", "-p", "cpu_log", "-p",
       "no:cacheprovider", "-p", "no:randomly", str(tmp_path)],
      cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300,
      check=False)
  assert proc.returncode == 0, proc.stdout + proc.stderr


def test_each_test_gets_its_cpu_and_wall_seconds(tmp_path):
  base = str(tmp_path / "cpu")
  _run_inner(tmp_path, base)
  rows = {}
  for line in pathlib.Path(base + ".main").read_text().splitlines():
    cpu, wall, node = line.split("\t")
    rows[node.split("::")[-1]] = (float(cpu), float(wall))
  assert set(rows) == {"test_busy", "test_sleeps", "test_child_busy"}
  assert rows["test_busy"][0] >= 0.3           # its own CPU
  assert rows["test_child_busy"][0] >= 0.3     # a child's CPU counts
  assert rows["test_sleeps"][0] < 0.2 <= 0.3 <= rows["test_sleeps"][1]


def test_nothing_is_written_without_the_variable(tmp_path):
  _run_inner(tmp_path, None)
  assert not list(tmp_path.glob("cpu*"))
  assert cpu_log.log_path("x").startswith("x.")
