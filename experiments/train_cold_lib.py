"""Cold starts of the main job (``python -m experiments.train``), timed.

``run_once`` starts the job in a new process on empty caches (``HOME``,
``TESSEL_JAX_CACHE``, ``XDG_CACHE_HOME`` in a fresh temporary folder; no
``JAX_COMPILATION_CACHE_DIR``) and reads its output as it comes: the wall
time and the process's CPU seconds at its first line, at every progress
line of ``tj.schedule`` (trace, cut, kernels, profile, search, ...), when the
build and the compile are done and when step 0 is printed, where it stops
the process (what follows, the check and the other steps, is not timed).
``rounds`` alternates several versions (one interpreter and checkout each),
shuffled per round.
"""

from __future__ import annotations

import os
import random
import re
import subprocess
import tempfile
import time
from collections.abc import Mapping, Sequence
from typing import Any

#: A progress line of ``tj.schedule``: ``schedule('gpt_loss'): profile 2.3 s``.
_PHASE = re.compile(r"schedule\('[^']*'\): ([a-z][a-z ]*?) [0-9.]+ s")


def mark_of(line: str) -> str | None:
  """The timeline mark a line of the job's output sets, or None."""
  m = _PHASE.search(line)
  if m:
    return m.group(1)
  for prefix, mark in (("step   0 ", "step 0"), ("built in ", "built"),
                       ("schedule (", "compiled")):
    if line.startswith(prefix):
      return mark
  return None


def _cpu_seconds(pid: int) -> float:
  """User + system CPU seconds of process ``pid`` and its waited children
  (nan once it is gone)."""
  try:
    with open(f"/proc/{pid}/stat", encoding="ascii") as f:
      fields = f.read().rsplit(")", 1)[1].split()
  except OSError:
    return float("nan")
  return sum(int(x) for x in fields[11:15]) / os.sysconf("SC_CLK_TCK")


def run_once(python: str, cwd: str, args: Sequence[str]) -> dict[str, Any]:
  """One cold start; ``{"marks": {mark: [wall s, CPU s]}, "first_line",
  "step0_line", "load"}`` (``load``: the 1-minute load average at start)."""
  home = tempfile.mkdtemp(prefix="train_cold_")
  env = dict(os.environ, HOME=home, TESSEL_JAX_CACHE=f"{home}/tj",
             XDG_CACHE_HOME=f"{home}/xdg")
  env.pop("JAX_COMPILATION_CACHE_DIR", None)
  load = os.getloadavg()[0]
  t0 = time.perf_counter()
  proc = subprocess.Popen(
      [python, "-m", "experiments.train", *args], cwd=cwd, env=env,
      stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
  marks: dict[str, list[float]] = {}
  out: dict[str, Any] = {"load": round(load, 2), "marks": marks}
  assert proc.stdout is not None
  for line in proc.stdout:
    now = [round(time.perf_counter() - t0, 3), round(_cpu_seconds(proc.pid), 2)]
    marks.setdefault("first line", now)
    mark = mark_of(line)
    if mark is not None and mark not in marks:
      marks[mark] = now
    if mark == "step 0":
      out["step0_line"] = line.strip()
      proc.kill()
      break
  proc.wait()
  if "step 0" not in marks:
    out["error"] = f"exited {proc.returncode} before step 0"
  return out


def rounds(versions: Mapping[str, tuple[str, str]], args: Sequence[str],
           count: int, log=print, seed: int = 0) -> list[dict[str, Any]]:
  """``count`` rounds, each version once per round in shuffled order;
  ``versions``: name -> (python, checkout)."""
  rng = random.Random(seed)
  rows = []
  for r in range(count):
    order = list(versions)
    rng.shuffle(order)
    for name in order:
      python, cwd = versions[name]
      row = {"round": r, "version": name, **run_once(python, cwd, args)}
      rows.append(row)
      log(summary(row))
  return rows


def summary(row: Mapping[str, Any]) -> str:
  """One line: version, load and wall / CPU seconds at the main marks."""
  marks = row["marks"]
  parts = [f"{m} {marks[m][0]:.2f}/{marks[m][1]:.1f}"
           for m in ("first line", "kernels", "profile", "built", "compiled",
                     "step 0") if m in marks]
  return (f"{row['version']} (load {row['load']}): " + ", ".join(parts) +
          (f"  [{row['error']}]" if "error" in row else ""))
