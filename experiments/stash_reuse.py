"""What a larger stash costs a step on this machine, split in two: the
reuse distance alone, and the footprint (the stash created and zero-filled
every step).

  python -m experiments.stash_reuse --slots=8,16 --slot_kb=256,1024

Each variant runs the same kernels (``tanh(x @ W)`` forward, its gradient
backward) and the same stash traffic (every slot written once, read once):
- ``near``: each slot read right after it is written (1F1B-like);
- ``far``: every slot written, then read back in reverse (GPipe-like);
- ``near1``: as ``near`` with a 1-slot stash instead of ``slots`` slots.
``far`` over ``near`` (same footprint) is the reuse distance; ``far`` over
``near1`` adds the footprint (``tessel_jax.cost.stash_fill`` prices that).
Shuffled paired rounds, process CPU and wall; prints ms per MB of the extra
slots.
"""

from __future__ import annotations

import os
import random
import statistics
import time

from absl import flags

from experiments import cli

flags.DEFINE_list("slots", ["8", "16"], "Stash slots (micro-batches held).")
flags.DEFINE_list("slot_kb", ["256", "1024"], "KiB per slot.")
flags.DEFINE_integer("rounds", 11, "Paired rounds (5 calls each).")


def programs(slots: int, rows: int, width: int = 256) -> dict:
  """The three jitted variants (see the module docstring)."""
  import jax  # pylint: disable=import-outside-toplevel
  import jax.numpy as jnp  # pylint: disable=import-outside-toplevel
  w = jax.random.normal(jax.random.PRNGKey(0), (width, width)) * 0.05

  def fwd(x):
    return jnp.tanh(x @ w)

  def bwd(a, g):
    return (g * (1 - a * a)) @ w.T

  def near(held):
    def run(x):
      def body(i, c):
        g, st = c
        st = jax.lax.dynamic_update_index_in_dim(st, fwd(x + i), 0, 0)
        return g + bwd(jax.lax.dynamic_index_in_dim(st, 0, 0, False),
                       g * 0 + 1.0), st
      st = jnp.zeros((held, rows, width))
      return jax.lax.fori_loop(0, slots, body, (jnp.zeros_like(x), st))[0]
    return jax.jit(run)

  def far(x):
    def f(i, st):
      return jax.lax.dynamic_update_index_in_dim(st, fwd(x + i), i, 0)

    def b(i, c):
      st, g = c
      return st, g + bwd(jax.lax.dynamic_index_in_dim(st, slots - 1 - i, 0,
                                                      False), g * 0 + 1.0)
    st = jax.lax.fori_loop(0, slots, f, jnp.zeros((slots, rows, width)))
    return jax.lax.fori_loop(0, slots, b, (st, jnp.zeros_like(x)))[1]

  return {"near": near(slots), "far": jax.jit(far), "near1": near(1)}


def measure(slots: int, slot_kb: int, rounds: int) -> dict:
  """Median per-call CPU ms of each variant and paired ratios."""
  import jax  # pylint: disable=import-outside-toplevel
  rows = slot_kb * 1024 // 4 // 256
  x = jax.random.normal(jax.random.PRNGKey(1), (rows, 256))
  progs = programs(slots, rows)
  for p in progs.values():
    jax.block_until_ready(p(x))
  rec = {k: [] for k in progs}
  order, rng = list(progs), random.Random(0)
  for _ in range(rounds):
    rng.shuffle(order)
    for k in order:
      c0, t0 = time.process_time(), time.perf_counter()
      for _ in range(5):
        jax.block_until_ready(progs[k](x))
      rec[k].append(((time.perf_counter() - t0) / 5,
                     (time.process_time() - c0) / 5))
  mb = (slots - 1) * slot_kb / 1024

  def paired(a, b, i):
    return statistics.median(p[i] / q[i] for p, q in zip(rec[a], rec[b]))

  cpu = {k: statistics.median(r[1] for r in v) for k, v in rec.items()}
  return {"slots": slots, "slot_kb": slot_kb, "extra_mb": mb,
          "cpu_ms": {k: round(1e3 * v, 3) for k, v in cpu.items()},
          "reuse_cpu": round(paired("far", "near", 1), 4),
          "footprint_cpu": round(paired("far", "near1", 1), 4),
          "footprint_wall": round(paired("far", "near1", 0), 4),
          "reuse_ms_per_mb": round(1e3 * (cpu["far"] - cpu["near"]) / mb, 4),
          "footprint_ms_per_mb": round(
              1e3 * (cpu["far"] - cpu["near1"]) / mb, 4),
          "load": round(os.getloadavg()[0], 1)}


def main(argv: list[str]) -> None:
  cli.no_arguments(argv)
  f = flags.FLAGS
  for s in f.slots:
    for kb in f.slot_kb:
      print(measure(int(s), int(kb), f.rounds), flush=True)


if __name__ == "__main__":
  cli.run(main)
