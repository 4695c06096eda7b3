"""Library of ``experiments.peer_bench_perf``: perf samples of a 4-stage
``peer_bench`` step charged to kinds of code (no flags; the binary reads them).
"""

from __future__ import annotations

import collections
import os
import re
import resource
import signal
import subprocess
import tempfile
import time
from collections.abc import Mapping

CATEGORIES = ("dot (ynn)", "dot (Eigen GEMM)", "transpose", "JIT fusions",
              "memcpy/memset", "page faults", "scheduling/futex",
              "XLA runtime", "malloc", "other")
_MM = re.compile(r"page|_mm|mm_|folio|lruvec|memcg|mas_|pte|vma|clear_|rmap|"
                 r"tlb|zap|alloc_pages|buddy")


def category(dso: str, symbol: str) -> str:
  """The kind of code a perf sample ran (``dso``: its library, e.g.
  ``libjax_common.so``, ``[kernel.kallsyms]``, ``[JIT] tid 7``)."""
  if "ynn" in symbol and "dot" in symbol:
    return "dot (ynn)"
  if "gemm" in symbol or "gebp" in symbol or "Contraction" in symbol:
    return "dot (Eigen GEMM)"
  if "transpose" in symbol:
    return "transpose"
  if dso.startswith("[JIT]"):
    return "JIT fusions"
  if dso.startswith("[kernel"):
    return "page faults" if _MM.search(symbol) else "scheduling/futex"
  if "memmove" in symbol or "memcpy" in symbol or "memset" in symbol:
    return "memcpy/memset"
  if "malloc" in symbol or "free" in symbol:
    return "malloc"
  if "libjax" in dso or "xla" in symbol:
    return "XLA runtime"
  return "other"


def shares(report: str) -> dict[str, float]:
  """Share of samples per category, from ``perf report --stdio -F
  period,dso,sym`` text."""
  got: dict[str, float] = collections.defaultdict(float)
  for line in report.splitlines():
    parts = line.split(None, 2)
    if line.startswith("#") or len(parts) < 3 or not parts[0].isdigit():
      continue
    sym = parts[2].split("] ", 1)[-1]
    got[category(parts[1], sym)] += int(parts[0])
  total = sum(got.values()) or 1.0
  return {c: got.get(c, 0.0) / total for c in CATEGORIES}


def top_symbols(report: str, k: int) -> list[tuple[str, str, float]]:
  """The ``k`` symbols with the most samples: ``(category, symbol, share)``
  (from the same ``perf report`` text as :func:`shares`)."""
  got: dict[tuple[str, str], float] = collections.defaultdict(float)
  for line in report.splitlines():
    parts = line.split(None, 2)
    if line.startswith("#") or len(parts) < 3 or not parts[0].isdigit():
      continue
    sym = parts[2].split("] ", 1)[-1].strip()
    got[(category(parts[1], sym), sym[:90])] += int(parts[0])
  total = sum(got.values()) or 1.0
  best = sorted(got.items(), key=lambda kv: -kv[1])[:k]
  return [(c, s, v / total) for (c, s), v in best]


def _cpu_s() -> float:
  r = resource.getrusage(resource.RUSAGE_SELF)
  return r.ru_utime + r.ru_stime


def worker(name: str, steps: int, n: int, top: int = 0) -> dict:
  """Builds ``name``, then samples ``steps`` steps of it; its row (with
  ``top`` > 0: its hottest symbols, CPU ms per step, under ``"top"``)."""
  # pylint: disable=import-outside-toplevel
  from experiments import peer_bench_lib as pbl
  args = pbl.PeerArgs(stages=4, layers=8, ns=(n,), variants=(name,))
  run, built = pbl._build(name, n, args)  # pylint: disable=protected-access
  run()
  with tempfile.TemporaryDirectory() as tmp:
    data = os.path.join(tmp, "perf.data")
    perf = subprocess.Popen(["perf", "record", "-q", "-F", "499", "-p",
                             str(os.getpid()), "-o", data],
                            stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    time.sleep(1.0)  # perf attached
    c0, t0 = _cpu_s(), time.perf_counter()
    for _ in range(steps):
      run()
    cpu, wall = _cpu_s() - c0, time.perf_counter() - t0
    perf.send_signal(signal.SIGINT)
    perf.wait()
    report = subprocess.run(
        ["perf", "report", "-i", data, "--no-children", "--stdio",
         "--sort", "dso,sym", "-F", "period,dso,sym"],
        capture_output=True, text=True, check=True).stdout
  cpu_ms = 1e3 * cpu / steps
  return {"variant": name, "n": n, "cpu_ms": round(cpu_ms, 1),
          "wall_ms": round(1e3 * wall / steps, 1),
          "lowered_as": built.get("lowered_as", ""),
          "temp_mb": round(built.get("temp_bytes", 0) / 1e6, 1),
          "ms": {c: round(cpu_ms * s, 1) for c, s in shares(report).items()},
          "top": [(c, s, round(cpu_ms * v, 1))
                  for c, s, v in top_symbols(report, top)],
          "load_average": os.getloadavg()}


def markdown(rows: list[Mapping]) -> str:
  """CPU ms per step by category, one line per variant."""
  head = ["variant", "CPU ms", "temp MB"] + list(CATEGORIES)
  lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
  for r in rows:
    cells = [r["variant"], f"{r['cpu_ms']:.0f}", f"{r['temp_mb']:.0f}"] + [
        f"{r['ms'][c]:.0f}" for c in CATEGORIES]
    lines.append("| " + " | ".join(cells) + " |")
  return "\n".join(lines)
