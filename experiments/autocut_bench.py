"""Measure the automatic cut: busiest block vs the best contiguous cut.

  python -m experiments.autocut_bench                       # everything
  python -m experiments.autocut_bench --models=plain --blocks=4

For small unmarked GPTs (plain JAX; Flax nnx and Equinox when importable)
and each number of forward blocks K: the cut time, the DP cut's busiest
block (forward + backward, compiled alone and timed) and the same for the
best contiguous cut under timed groups of equations (enumerated; target
ratio <= 1.10), plus the cut time of a 12-layer small GPT. JSON to --output
and a printed table. XLA runs single-threaded on CPU (--single_thread) so
that other processes on the machine disturb the timings less.
"""

import os
import sys

from absl import flags

from experiments import cli, xla_env
from experiments import autocut_bench_args

# --help lists the flags of autocut_bench_args (defined there, read by this binary).
flags.adopt_module_key_flags(autocut_bench_args)


def main(argv: list[str]) -> None:
  cli.no_arguments(argv)
  args = autocut_bench_args.from_flags()
  if args.single_thread:
    # One intra-op thread: timings then barely move when other processes
    # take the other core (XLA reads XLA_FLAGS at its first device use).
    xla_env.add_xla_flags(xla_env.cpu_flags(single_thread=True),
                          platform=None)
  os.environ.setdefault("JAX_PLATFORMS", "cpu")
  from experiments import autocut_bench_lib  # pylint: disable=import-outside-toplevel
  sys.exit(autocut_bench_lib.main(args))


if __name__ == "__main__":
  cli.run(main)
