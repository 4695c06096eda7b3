"""Flags of ``python -m experiments.inference_speedup``, read into
``SpeedupArgs``.

Importing this module defines the flags; only the binary imports it. It imports
no jax (``from_flags`` imports ``inference_speedup_lib`` once the flags are
checked), so ``--help`` stays cheap.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from absl import app, flags

from experiments import cli

if TYPE_CHECKING:
  from experiments.inference_speedup_lib import SpeedupArgs

flags.DEFINE_list("placements", ["vshape", "mllm", "xshape"],
                  "Placements pipelined on 2 fake devices (each against the"
                  " plain batch).")
flags.DEFINE_integer("microbatches", 8, "Micro-batches N of the batch.")
flags.DEFINE_integer("vocab", 8192, "GPT vocabulary (embedding and tied"
                     " head).")
flags.DEFINE_integer("d_model", 128, "GPT width.")
flags.DEFINE_integer("layers", 6, "GPT transformer layers.")
flags.DEFINE_integer("heads", 4, "GPT attention heads.")
flags.DEFINE_integer("seq", 64, "Sequence length.")
flags.DEFINE_integer("rows", 8, "Sequences per micro-batch (even: X-shape"
                     " halves, M-shape blocks split rows over 2 devices).")
flags.DEFINE_integer("rounds", 7, "Timing rounds (every variant once per"
                     " round, shuffled).")
flags.DEFINE_float("quiet_cores", 0.15, "A round counts when the rest of the"
                   " machine used fewer cores than this in each timing.")
flags.DEFINE_integer("profile_rounds", 3, "Times each layer is measured to"
                     " balance the layer groups (the smallest kept).")
flags.DEFINE_bool("profile", True, "Profile one step of each pipelined"
                  " program by part (XLA's trace, experiments.step_profile).")
flags.DEFINE_bool("realtime", True, "Run the workers at real-time priority"
                  " (every thread SCHED_RR, profiling and timing; needs root"
                  " or CAP_SYS_NICE, else normal priority).")
flags.DEFINE_integer("seed", 0, "Parameter, data and round-order seed.")
flags.DEFINE_string("output",
                    "results/inference_speedup/inference_speedup.json",
                    "JSON results (a .md table beside it); '': print only.")
flags.DEFINE_string("worker", None, "Internal: run one worker process"
                    " ('plain_1core', 'plain_2core' or 'pipe').")


def from_flags() -> SpeedupArgs:
  """Reads the parsed flags into ``SpeedupArgs``.

  Raises:
    app.UsageError: for unknown placements or out-of-range numbers.
  """
  f = flags.FLAGS
  cli.check_created(f.output, "--output", suffixes=(".json",))
  from experiments.inference_speedup_lib import PLACEMENTS, PLAIN, SpeedupArgs  # pylint: disable=import-outside-toplevel
  bad = [p for p in f.placements if p not in PLACEMENTS]
  if bad or not f.placements:
    raise app.UsageError(f"--placements {f.placements}: choose from"
                         f" {list(PLACEMENTS)}")
  for key in ("microbatches", "vocab", "d_model", "layers", "heads", "seq",
              "rows", "rounds", "profile_rounds"):
    if getattr(f, key) < 1:
      raise app.UsageError(f"--{key} must be >= 1, got {getattr(f, key)}")
  if f.rows % 2:
    raise app.UsageError(f"--rows must be even (X-shape halves, 2-device"
                         f" blocks split rows), got {f.rows}")
  if f.d_model % f.heads:
    raise app.UsageError(f"--d_model {f.d_model} must divide by --heads"
                         f" {f.heads}")
  if f.worker not in (None, "pipe", *PLAIN):
    raise app.UsageError("--worker is internal")
  return SpeedupArgs(
      placements=tuple(f.placements), microbatches=f.microbatches,
      vocab=f.vocab, d_model=f.d_model, layers=f.layers, heads=f.heads,
      seq=f.seq, rows=f.rows, rounds=f.rounds, quiet_cores=f.quiet_cores,
      profile_rounds=f.profile_rounds, profile=f.profile,
      realtime=f.realtime, seed=f.seed,
      output=f.output or None, worker=f.worker)
