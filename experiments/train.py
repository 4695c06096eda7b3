"""Train a small GPT with a searched pipeline schedule on fake CPU devices.

  python -m experiments.train --placement=mshape --devices=4

Character-level GPT (embedding, --layers transformer layers, head tied to
the embedding) on the source text of Python's own standard library (no
download). Prints the schedule grid and the loss of every step, checks step 0
against ``jax.value_and_grad``, saves the schedule picture and a JSON record.
"""

import os
import sys

from absl import flags

from experiments import cli
from experiments import train_args

# --help lists the flags of train_args (defined there, read by this binary).
flags.adopt_module_key_flags(train_args)


def main(argv: list[str]) -> None:
  cli.no_arguments(argv)
  # jax reads JAX_PLATFORMS when imported and XLA_FLAGS when it creates its
  # CPU client: set both (the fake device count first) before from_flags,
  # which checks the flags, logs the first line and then imports jax.
  f = flags.FLAGS
  flag = f"--xla_force_host_platform_device_count={f.devices * f.data}"
  os.environ["XLA_FLAGS"] = " ".join(
      x for x in (os.environ.get("XLA_FLAGS", ""), flag) if x)
  os.environ.setdefault("JAX_PLATFORMS", "cpu")
  os.environ.setdefault("MPLBACKEND", "Agg")
  args = train_args.from_flags()
  from experiments import train_lib  # pylint: disable=import-outside-toplevel
  sys.exit(train_lib.main(args))


if __name__ == "__main__":
  cli.run(main)
