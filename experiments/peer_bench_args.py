"""Flags of ``python -m experiments.peer_bench``, read into ``PeerArgs``.

Importing this module defines the flags; only the binary imports it. It imports
no jax (``from_flags`` imports ``peer_bench_lib`` once the flags are checked),
so ``--help`` stays cheap.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from absl import app, flags

from experiments import cli

if TYPE_CHECKING:
  from experiments.peer_bench_lib import PeerArgs

flags.DEFINE_integer("hidden", 1024, "Width of the MLP (layers"
                     " tanh(h @ W + b)).")
flags.DEFINE_integer("layers", None, "Layers of the MLP, a multiple of"
                     " --stages (of 2 x --stages with tj_mshape or tj_zbv);"
                     " default 4 at 2 stages, 8 at 4.")
flags.DEFINE_enum("stages", "2", ["2", "4"], "Pipeline stages = fake CPU"
                  " devices of the pipelined variants (pinned to the same 2"
                  " cores); 4: the issue's 4-stage work ratio.")
flags.DEFINE_integer("rows", 256, "Rows per micro-batch.")
flags.DEFINE_list("ns", ["8", "32"], "Micro-batch counts N.")
flags.DEFINE_integer("rounds", 7, "Timing rounds (every variant once per"
                     " round, shuffled).")
flags.DEFINE_float("quiet_cores", 0.15, "A round counts when the rest of the"
                   " machine used fewer cores than this in each timing.")
flags.DEFINE_enum("cost", "measured", ["measured", "uniform"],
                  "tessel_jax's cost mode for its variants.")
flags.DEFINE_list("variants", None, "Variants to build and time; default"
                  " ['plain_1core', 'plain_2core', 'data_parallel',"
                  " 'hand_gpipe', 'tj_searched', 'tj_gpipe', 'tj_1f1b',"
                  " 'tj_compact'] at 2 stages, ['plain_1core', 'hand_gpipe',"
                  " 'tj_gpipe', 'tj_mshape', 'tj_zbv'] at 4.")
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
  stages = int(f.stages)
  from experiments.peer_bench_lib import DEFAULT_VARIANTS, VARIANTS, PeerArgs  # pylint: disable=import-outside-toplevel
  variants = tuple(f.variants or DEFAULT_VARIANTS[stages])
  bad = [v for v in variants if v not in VARIANTS]
  if bad:
    raise app.UsageError(f"unknown --variants {bad}; choose from {VARIANTS}")
  try:
    ns = tuple(int(n) for n in f.ns)
  except ValueError:
    raise app.UsageError(f"--ns must be integers: {f.ns}") from None
  if any(n < 2 or n % stages for n in ns):
    raise app.UsageError(f"--ns must be multiples of --stages={stages}"
                         f" (data parallel splits N over the devices): {ns}")
  layers = f.layers or 2 * stages
  unit = 2 * stages if {"tj_mshape", "tj_zbv"} & set(variants) else stages
  if layers < unit or layers % unit:
    raise app.UsageError(f"--layers={layers} must be a multiple of {unit}"
                         f" ({stages} stages; tj_mshape and tj_zbv split"
                         f" them into 2 x {stages} blocks)")
  if f.hidden < 1 or f.rows < 1 or f.rounds < 1:
    raise app.UsageError("--hidden, --rows and --rounds must be >= 1")
  if f.worker not in (None, "plain_1core", "plain_2core", "pipe"):
    raise app.UsageError("--worker is internal")
  return PeerArgs(hidden=f.hidden, layers=layers, stages=stages, rows=f.rows,
                  ns=ns, rounds=f.rounds, quiet_cores=f.quiet_cores,
                  cost=f.cost, variants=variants, seed=f.seed,
                  output=f.output or None, worker=f.worker)
