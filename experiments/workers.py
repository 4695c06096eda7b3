"""Benchmark worker processes: one pinned to cores, timed over JSON lines.

``peer_bench`` and ``inference_speedup`` build their programs in worker
processes (each with its own ``XLA_FLAGS``: fake devices, threads), then the
parent times them round by round. The protocol, one JSON object a line:

* while building, the worker prints ``{"built": row}`` for each program,
  then ``{"ready": true, ...}`` (extra keys are the worker's to add);
* then it answers each ``time KEY...`` line on its stdin with
  ``{"wall_s": ..., "cpu_s": ...}`` (its own process CPU time) until
  ``quit`` or end of input.

:func:`serve` is the worker's side, :class:`Worker` the parent's. A timing
also says how many cores the rest of the machine used meanwhile on the
worker's cores (``others_cores``, from ``/proc/stat``), so runners can keep
only quiet rounds.
"""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import jax

USER_HZ = os.sysconf("SC_CLK_TCK")


def cpu_s() -> float:
  """User + system CPU seconds of this process so far."""
  r = resource.getrusage(resource.RUSAGE_SELF)
  return r.ru_utime + r.ru_stime


def busy_jiffies(cores: Sequence[int] | None = None) -> int:
  """Busy jiffies (``/proc/stat``: all but idle and iowait) of ``cores``,
  or of the whole machine when ``cores`` is None."""
  want = ({"cpu"} if cores is None else {f"cpu{c}" for c in cores})
  total = 0
  with open("/proc/stat") as f:
    for line in f:
      parts = line.split()
      if parts and parts[0] in want:
        fields = [int(x) for x in parts[1:]]
        total += sum(fields) - fields[3] - (fields[4] if len(fields) > 4
                                            else 0)
  return total


def serve(runs: Mapping[str, Callable[[], Any]]) -> None:
  """The worker's timing loop: ``time KEY...`` runs ``runs["KEY..."]``
  (words joined by one space) and prints its wall and CPU seconds."""
  for line in sys.stdin:
    cmd = line.split()
    if not cmd or cmd[0] == "quit":
      break
    run = runs[" ".join(cmd[1:])]
    c0, t0 = cpu_s(), time.perf_counter()
    jax.block_until_ready(run())
    wall, cpu = time.perf_counter() - t0, cpu_s() - c0
    print(json.dumps({"wall_s": wall, "cpu_s": cpu}), flush=True)


class Worker:
  """One worker process pinned to ``cores``, spoken to over stdin/stdout.

  Starting it waits until the worker is ready; ``built`` holds its
  ``built`` rows (each with ``cores`` added), ``ready`` its ready message.
  """

  def __init__(self, label: str, cmd: Sequence[str], cores: Sequence[int],
               env: Mapping[str, str], log: Callable[[str], None]):
    """Starts ``cmd`` on ``cores`` with environment ``env``.

    Args:
      label: Names the worker in messages (``"peer_bench worker pipe"``).
      cmd: The worker's command line.
      cores: CPU cores it is pinned to (its timings watch these).
      env: Its whole environment.
      log: Gets one line per built row.

    Raises:
      RuntimeError: if the worker ends before it is ready.
    """
    self.label = label
    self.cores = list(cores)
    self.proc = subprocess.Popen(
        list(cmd), stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
        env=dict(env), preexec_fn=lambda: os.sched_setaffinity(0, cores))
    self.built: list[dict[str, Any]] = []
    while True:
      msg = self._read()
      if "ready" in msg:
        self.ready: dict[str, Any] = msg
        break
      self.built.append(msg["built"] | {"cores": self.cores})
      log(f"built {self.built[-1]}")

  def _read(self) -> dict[str, Any]:
    line = self.proc.stdout.readline()
    if not line:
      raise RuntimeError(f"{self.label} ended early (exit"
                         f" {self.proc.wait()}); see its stderr above")
    return json.loads(line)

  def time(self, *key: Any) -> dict[str, Any]:
    """Times the program ``key`` once: the worker's ``wall_s`` and
    ``cpu_s`` and ``others_cores``, the cores the rest of the machine used
    on this worker's cores meanwhile (busy jiffies less the worker's CPU,
    over the wall time seen here)."""
    j0, t0 = busy_jiffies(self.cores), time.perf_counter()
    self.proc.stdin.write(" ".join(["time", *map(str, key)]) + "\n")
    self.proc.stdin.flush()
    res = self._read()
    wall = time.perf_counter() - t0
    others = ((busy_jiffies(self.cores) - j0) / USER_HZ - res["cpu_s"]) / wall
    return res | {"others_cores": round(others, 3)}

  def close(self) -> None:
    """Asks the worker to quit and waits for it."""
    self.proc.stdin.write("quit\n")
    self.proc.stdin.close()
    self.proc.wait()
