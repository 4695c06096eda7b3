"""experiments.workers and experiments.realtime: the shared worker client."""

import os
import sys

import pytest

from experiments import realtime, workers

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# A worker that builds two "programs", says ready with an extra key, then
# serves them; "slow" burns CPU so its timing has CPU seconds to show.
_WORKER = """
import json
from experiments import workers
print(json.dumps({"built": {"variant": "fast"}}), flush=True)
print(json.dumps({"built": {"variant": "slow"}}), flush=True)
print(json.dumps({"ready": True, "realtime_threads": 0}), flush=True)
def slow():
  return sum(i * i for i in range(2_000_000))
workers.serve({"fast 4": lambda: 1, "slow": slow})
"""


def _env():
  return dict(os.environ, PYTHONPATH=REPO)


def test_worker_reads_built_rows_and_times_programs():
  lines = []
  cores = sorted(os.sched_getaffinity(0))[:1]
  w = workers.Worker("test worker", [sys.executable, "-c", _WORKER], cores,
                     _env(), lines.append)
  try:
    assert [b["variant"] for b in w.built] == ["fast", "slow"]
    assert all(b["cores"] == cores for b in w.built)
    assert w.ready == {"ready": True, "realtime_threads": 0}
    assert len(lines) == 2 and "fast" in lines[0]
    fast = w.time("fast", 4)
    slow = w.time("slow")
    assert set(fast) == {"wall_s", "cpu_s", "others_cores"}
    assert slow["cpu_s"] > 10 * fast["cpu_s"]
    assert slow["wall_s"] > 0 and slow["others_cores"] >= -1.0
  finally:
    w.close()
  assert w.proc.returncode == 0


def test_worker_that_dies_says_so():
  with pytest.raises(RuntimeError, match="test worker ended early"):
    workers.Worker("test worker", [sys.executable, "-c", "import sys;"
                                   " sys.exit(3)"], sorted(os.sched_getaffinity(0))[:1],
                   _env(), print)


def test_busy_jiffies_grow_and_cover_the_cores():
  cores = sorted(os.sched_getaffinity(0))
  before_all, before = workers.busy_jiffies(), workers.busy_jiffies(cores)
  sum(i for i in range(3_000_000))
  assert workers.busy_jiffies() >= before_all
  assert workers.busy_jiffies(cores) >= before
  assert workers.busy_jiffies([10_000]) == 0


def test_realtime_round_trip():
  if realtime.realtime_threads() == 0:
    assert not realtime.realtime_now()
    pytest.skip("no permission for SCHED_RR here")
  try:
    assert realtime.realtime_now()
  finally:
    realtime.normal_priority()
  assert not realtime.realtime_now()
