"""Flags of ``python -m experiments.train_step_ab``, read into
``TrainStepAbArgs``.

Importing this module defines the flags; only the binary imports it.
"""

from __future__ import annotations

from absl import app, flags

from experiments import cli
from experiments.resnet_variants import VARIANTS, check_names
from experiments.train_step_ab_lib import TrainStepAbArgs

flags.DEFINE_list("variants", ["base", "workspace"],
                  f"Variants, the first the reference: {sorted(VARIANTS)}.")
flags.DEFINE_integer("rounds", 7, "Timed rounds (each variant once each).")
flags.DEFINE_string("output", "out/train_step_ab.json",
                    "Where to write the JSON results ('': stdout only).")


def from_flags() -> TrainStepAbArgs:
  """Reads the parsed flags into ``TrainStepAbArgs``.

  Raises:
    app.UsageError: for unknown variants or fewer than one round.
  """
  f = flags.FLAGS
  cli.check_created(f.output, "--output", suffixes=(".json",))
  check_names(f.variants)
  if f.rounds < 1:
    raise app.UsageError(f"--rounds must be >= 1, got {f.rounds}")
  return TrainStepAbArgs(variants=tuple(f.variants), rounds=f.rounds,
                         output=f.output or None)
