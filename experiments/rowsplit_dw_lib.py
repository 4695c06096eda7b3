"""The work of ``experiments.rowsplit_dw`` (its flags are defined and
documented there; its ``main`` imports this module, so that
``--help`` imports no jax, CP-SAT or matplotlib). Reads the
flags it is given (``absl.flags.FLAGS``)."""

from __future__ import annotations

import os
import random
import resource
import time
from collections.abc import Callable

import jax
import numpy as np
from absl import flags

from experiments import cli


def _cpu_s() -> float:
  r = resource.getrusage(resource.RUSAGE_SELF)
  return r.ru_utime + r.ru_stime


def variants(width: int = 1024) -> dict[str, Callable[[], None]]:
  """Name -> one layer's weight gradient over 256 rows, split or not."""
  key = jax.random.PRNGKey(0)
  xs = {r: (jax.random.normal(key, (r, width)),
            jax.random.normal(jax.random.fold_in(key, 1), (r, width)))
        for r in (64, 256)}
  acc = [jax.numpy.zeros((width, width))]
  add = jax.jit(lambda a, x, dy: a + x.T @ dy, donate_argnums=0)
  dw = jax.jit(lambda x, dy: x.T @ dy)

  def split(accumulate: bool, rows: int) -> Callable[[], None]:
    def run() -> None:
      for _ in range(256 // rows):
        if accumulate:
          acc[0] = add(acc[0], *xs[rows])
          out = acc[0]
        else:
          out = dw(*xs[rows])
      out.block_until_ready()
    return run
  return {"64x4 + acc": split(True, 64), "256x1 + acc": split(True, 256),
          "64x4": split(False, 64), "256x1": split(False, 256)}


def measure(rounds: int = 30, reps: int = 5) -> None:
  """Times the variants ``rounds`` times; prints medians and the load."""
  fs = variants()
  for f in fs.values():
    f()
  res: dict[str, list[tuple[float, float]]] = {n: [] for n in fs}
  for _ in range(rounds):
    for n in random.sample(list(fs), len(fs)):
      c, t = _cpu_s(), time.perf_counter()
      for _ in range(reps):
        fs[n]()
      res[n].append(((time.perf_counter() - t) / reps * 1e3,
                     (_cpu_s() - c) / reps * 1e3))
  for n, v in res.items():
    w, c = np.median(np.array(v), 0)
    print(f"{n:12s} wall {w:.2f} ms  CPU {c:.2f} ms")
  print("load average", [round(x, 1) for x in os.getloadavg()])


def main(argv: list[str]) -> None:
  cli.no_arguments(argv)
  measure(flags.FLAGS.rounds)
