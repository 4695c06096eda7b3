"""experiments.progress: ETA lines and the heartbeat of slow silent calls."""

import time

from experiments import progress


def test_heartbeat_logs_while_running_and_stops_after():
  lines = []
  with progress.Heartbeat("compiling", lines.append, every=0.05):
    time.sleep(0.32)
  seen = len(lines)
  time.sleep(0.15)
  assert seen >= 3, lines
  assert len(lines) == seen            # nothing after the call returned
  assert all(l.startswith("  ... compiling: ") and l.endswith(" s so far")
             for l in lines)


def test_heartbeat_silent_for_a_fast_call():
  lines = []
  with progress.Heartbeat("fast", lines.append, every=1.0):
    pass
  assert lines == []


def test_eta_counts_and_estimates():
  eta = progress.Eta(4)
  assert eta.line("case a").startswith("1/4 case a (0 s so far, time left")
  assert eta.line("case b").startswith("2/4 case b (")
  done = progress.Eta(2)
  assert done.finished("x").startswith("1/2 x (about ")
