"""Flags of ``python -m experiments.device_ticks``, read into ``TicksArgs``.

Importing this module defines the flags; only the binary imports it. It imports
no jax (``from_flags`` imports ``device_ticks_lib`` once the flags are
checked), so ``--help`` stays cheap.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from absl import app, flags

from experiments import cli

if TYPE_CHECKING:
  from experiments.device_ticks_lib import TicksArgs

flags.DEFINE_integer("width", 1024, "MLP width (square weights).")
flags.DEFINE_integer("rows", 256, "Rows per micro-batch.")
flags.DEFINE_integer("layers", 4, "MLP layers, one block each.")
flags.DEFINE_list("ns", ["8", "32"], "Micro-batch counts N.")
flags.DEFINE_integer("rounds", 7, "Timing rounds (every variant once per"
                     " round, shuffled).")
flags.DEFINE_integer("ticks", 256, "Iterations of the tick-floor loops.")
flags.DEFINE_integer("branches", 8, "Branches of the tick-floor switch.")
flags.DEFINE_bool("profile", True, "Also one cost='measured' build: block"
                  " profiles on this backend and the predicted step.")
flags.DEFINE_string("output", "results/device_ticks/device_ticks.json",
                    "JSON results; '': print only.")


def from_flags() -> TicksArgs:
  """Reads the parsed flags into ``TicksArgs``.

  Raises:
    app.UsageError: for out-of-range numbers or bad ``--ns``.
  """
  f = flags.FLAGS
  if f.output:
    cli.check_created(f.output, "--output", suffixes=(".json",))
  try:
    ns = tuple(int(n) for n in f.ns)
  except ValueError as e:
    raise app.UsageError(f"--ns must be integers, got {f.ns}") from e
  for key in ("width", "rows", "layers", "rounds", "ticks", "branches"):
    if getattr(f, key) < 1:
      raise app.UsageError(f"--{key} must be >= 1, got {getattr(f, key)}")
  if not ns or min(ns) < 1:
    raise app.UsageError(f"--ns must be >= 1, got {f.ns}")
  from experiments.device_ticks_lib import TicksArgs  # pylint: disable=import-outside-toplevel
  return TicksArgs(width=f.width, rows=f.rows, layers=f.layers, ns=ns,
                   rounds=f.rounds, ticks=f.ticks, branches=f.branches,
                   profile=f.profile, output=f.output or None)
