"""Flags of ``python -m experiments.step_floor``, read into ``FloorArgs``.

Importing this module defines the flags; only the binary imports it. It
does not import jax (the binary sets the fake device count first).
"""

from __future__ import annotations

from absl import flags

from experiments import cli, model_zoo_flags

flags.adopt_module_key_flags(model_zoo_flags)
flags.DEFINE_integer("rounds", 15, "Timing rounds (every program once per"
                     " round, shuffled).")
flags.DEFINE_enum("cost", "measured", ["measured", "calibrated"],
                  "tj.schedule's cost for the zoo steps.")
flags.DEFINE_list("leaves", ["1", "4", "16", "64"], "Leaf counts of the"
                  " zero-work programs (as many in as out).")
flags.DEFINE_string("output", "results/model_zoo/step_floor.json",
                    "JSON results; '': print only.")


def from_flags():
  """Reads the parsed flags into ``step_floor_lib.FloorArgs`` (imports jax:
  call it after setting XLA_FLAGS)."""
  # pylint: disable-next=import-outside-toplevel
  from experiments.step_floor_lib import FloorArgs
  f = flags.FLAGS
  models, microbatches, rows = model_zoo_flags.read()
  model_zoo_flags.check_positive("rounds")
  leaves = tuple(int(x) for x in f.leaves)
  if not leaves or min(leaves) < 1:
    raise flags.ValidationError(f"--leaves {f.leaves}: positive integers")
  return FloorArgs(models=models, microbatches=microbatches, rows=rows,
                   rounds=f.rounds, cost=f.cost, leaves=leaves,
                   output=f.output or None)


def check_output() -> None:
  """Checks ``--output`` before jax starts (``app.UsageError``)."""
  cli.check_created(flags.FLAGS.output, "--output", suffixes=(".json",))
