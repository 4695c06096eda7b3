"""Copies XLA put in a lowered program, per while body and switch branch.

  python -m experiments.hlo_copies                 # peer_bench's MLP, N=8
  python -m experiments.hlo_copies --model=tp      # tp_bench's pipe2_model2

Compiles the program (8 fake CPU devices, uniform spans) with the default
lowering (``--interpret_ramps=8``) and the compact one (``0``) and prints,
for every while-loop body and conditional branch of the compiled HLO that
holds a ``copy``, the number of copies and the MiB they move each time it
runs (scalars left out), then the totals per kind. A copy in a loop body
runs every iteration (every tick of an interpreted ramp, every period of a
loop); one in a branch runs where the branch is taken.
"""

import os
import sys

from absl import flags

from experiments import cli
from experiments import hlo_copies_args

# --help lists the flags of hlo_copies_args (defined there, read by this binary).
flags.adopt_module_key_flags(hlo_copies_args)


def main(argv: list[str]) -> None:
  cli.no_arguments(argv)
  args = hlo_copies_args.from_flags()
  os.environ["XLA_FLAGS"] = " ".join(
      x for x in [os.environ.get("XLA_FLAGS", ""),
                  "--xla_force_host_platform_device_count=8"] if x)
  os.environ.setdefault("JAX_PLATFORMS", "cpu")
  from experiments import hlo_copies_lib  # pylint: disable=import-outside-toplevel
  sys.exit(hlo_copies_lib.main(args))


if __name__ == "__main__":
  cli.run(main)
