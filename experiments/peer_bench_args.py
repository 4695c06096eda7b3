"""Flags of ``python -m experiments.peer_bench``, read into ``PeerArgs``.

Importing this module defines the flags; only the binary imports it.
"""

from __future__ import annotations

from absl import app, flags

from experiments import cli
from experiments.peer_bench_lib import VARIANTS, PeerArgs

flags.DEFINE_integer("hidden", 1024, "Width of the MLP (4 layers"
                     " tanh(h @ W + b) by default).")
flags.DEFINE_integer("layers", 4, "Layers of the MLP (even: 2 stages).")
flags.DEFINE_integer("rows", 256, "Rows per micro-batch.")
flags.DEFINE_list("ns", ["8", "32"], "Micro-batch counts N.")
flags.DEFINE_integer("rounds", 7, "Timing rounds (every variant once per"
                     " round, shuffled).")
flags.DEFINE_float("quiet_cores", 0.15, "A round counts when the rest of the"
                   " machine used fewer cores than this in each timing.")
flags.DEFINE_enum("cost", "measured", ["measured", "uniform"],
                  "tessel_jax's cost mode for its variants.")
flags.DEFINE_list("variants", list(VARIANTS), "Variants to build and time.")
flags.DEFINE_integer("seed", 0, "Parameter seed (batch: seed + 1) and the"
                     " seed of the round order.")
flags.DEFINE_string("output", "results/peer_bench/peer_bench.json",
                    "JSON results (a .md table beside it); '': print only.")
flags.DEFINE_string("worker", None, "Internal: run one worker process"
                    " ('plain_1core', 'plain_2core' or 'pipe').")


def from_flags() -> PeerArgs:
  """Reads the parsed flags into ``PeerArgs``.

  Raises:
    app.UsageError: for unknown variants or out-of-range numbers.
  """
  f = flags.FLAGS
  cli.check_created(f.output, "--output", suffixes=(".json",))
  bad = [v for v in f.variants if v not in VARIANTS]
  if bad:
    raise app.UsageError(f"unknown --variants {bad}; choose from {VARIANTS}")
  try:
    ns = tuple(int(n) for n in f.ns)
  except ValueError:
    raise app.UsageError(f"--ns must be integers: {f.ns}") from None
  if any(n < 2 or n % 2 for n in ns):
    raise app.UsageError(f"--ns must be even numbers >= 2 (data parallel"
                         f" splits N over 2 devices): {ns}")
  if f.layers < 2 or f.layers % 2:
    raise app.UsageError(f"--layers must be even (two stages): {f.layers}")
  if f.hidden < 1 or f.rows < 1 or f.rounds < 1:
    raise app.UsageError("--hidden, --rows and --rounds must be >= 1")
  if f.worker not in (None, "plain_1core", "plain_2core", "pipe"):
    raise app.UsageError("--worker is internal")
  return PeerArgs(hidden=f.hidden, layers=f.layers, rows=f.rows, ns=ns,
                  rounds=f.rounds, quiet_cores=f.quiet_cores, cost=f.cost,
                  variants=tuple(f.variants), seed=f.seed,
                  output=f.output or None, worker=f.worker)
