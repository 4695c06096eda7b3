"""Flags of ``python -m experiments.fuzz``, read into ``FuzzArgs``.

Importing this module defines the flags; only the binary imports it. It imports
no jax (``from_flags`` imports ``fuzz_lib`` once the flags are checked), so
``--help`` stays cheap.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from absl import app, flags

from experiments import cli
from tessel_jax import checks

if TYPE_CHECKING:
  from experiments.fuzz_lib import FuzzArgs


flags.DEFINE_integer("cases", 100, "Random cases to search and check.")
flags.DEFINE_integer("seed", 0, "Seed of the case generator.")
flags.DEFINE_float("time_limit", 2.0,
                   "CP-SAT budget per search (seconds).")
flags.DEFINE_list("microbatches", ["1", "2", "3", "5", "16"],
                  "Micro-batch counts N each schedule is unrolled at.")
flags.DEFINE_integer("determinism_sample", 20,
                     "Cases searched again in a second process and compared"
                     " byte for byte (0: none).")
flags.DEFINE_float("hang_seconds", 60.0,
                   "A case slower than this counts as a hang.")
flags.DEFINE_integer("max_forwards", 8,
                     "Most forward blocks per placement (training doubles"
                     " them; inference up to twice as many).")
flags.DEFINE_float("max_seconds", 0.0,
                   "Stop starting cases after this many seconds and report"
                   " those run (0: run them all).")
flags.DEFINE_string("output", None, "Write the figures as JSON here.")


def from_flags() -> FuzzArgs:
  """Reads the parsed flags into ``FuzzArgs``.

  Raises:
    app.UsageError: for an out-of-range flag.
  """
  f = flags.FLAGS
  try:
    cases = checks.integer(f.cases, "--cases", low=1, high=10**6)
    checks.integer(f.seed, "--seed", low=0)
    checks.time_limit(f.time_limit, "--time_limit")
    ns = tuple(checks.integer(int(n) if n.strip().isdigit() else n,
                              "--microbatches", low=1, high=1000)
               for n in f.microbatches)
    if not ns:
      raise checks.InputError("--microbatches needs at least one N")
    checks.integer(f.determinism_sample, "--determinism_sample", low=0,
                   high=cases)
    checks.real(f.hang_seconds, "--hang_seconds", positive=True)
    checks.integer(f.max_forwards, "--max_forwards", low=1, high=8)
    checks.real(f.max_seconds, "--max_seconds", low=0)
  except checks.InputError as err:
    raise app.UsageError(str(err)) from None
  cli.check_output(f.output, "--output")
  from experiments.fuzz_lib import FuzzArgs  # pylint: disable=import-outside-toplevel
  return FuzzArgs(cases=cases, seed=f.seed, time_limit=f.time_limit,
                  microbatches=ns, determinism_sample=f.determinism_sample,
                  hang_seconds=f.hang_seconds, max_forwards=f.max_forwards,
                  max_seconds=f.max_seconds,
                  output=f.output)
