"""Per-test CPU seconds, for judging the suite's cost under load.

With ``TESSEL_JAX_TEST_CPU_LOG=PATH`` every test appends one line to
``PATH.<worker>`` (``main`` without xdist) as it ends: the CPU seconds of
the test process and of the child processes it waited for (setup, call
and teardown together), its wall seconds and its node id, tab-separated.
Load inflates wall time (``--durations``) far more than CPU time, so on a
busy machine the CPU column says which tests cost the suite work. A run
killed half-way keeps the lines of the tests that ended. Loaded by
``tests/conftest.py``; ``python -m pytest -p cpu_log`` loads it elsewhere.
"""

from __future__ import annotations

import os
import resource
import time
from typing import Any, Iterator

import pytest

ENV = "TESSEL_JAX_TEST_CPU_LOG"


def cpu_seconds() -> float:
  """User + system CPU seconds of this process and its reaped children."""
  own = resource.getrusage(resource.RUSAGE_SELF)
  kids = resource.getrusage(resource.RUSAGE_CHILDREN)
  return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime


def log_path(base: str) -> str:
  """``base`` suffixed with this xdist worker's id (``main`` without)."""
  return f"{base}.{os.environ.get('PYTEST_XDIST_WORKER', 'main')}"


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: Any, nextitem: Any) -> Iterator[None]:
  """Appends the test's CPU and wall seconds when ``ENV`` is set."""
  base = os.environ.get(ENV)
  cpu, wall = cpu_seconds(), time.perf_counter()
  yield
  if base:
    cpu, wall = cpu_seconds() - cpu, time.perf_counter() - wall
    with open(log_path(base), "a", encoding="utf-8") as f:
      f.write(f"{cpu:.3f}\t{wall:.3f}\t{item.nodeid}\n")
