"""placement="auto" on the README's GPT: chosen plan predicted vs measured.

  python -m experiments.auto_plan --devices=4 --memory_limits=none,1MiB

Prices every plan of the GPT of ``experiments.train`` on a 1-D mesh of fake
CPU devices (placements x pipe/data widths x searched or classic schedule),
times the choice cold and warm, then compiles and times the chosen plan and
the other candidates under each memory limit; writes a JSON record.
"""

import os
import sys

from absl import flags

from experiments import auto_plan_args
from experiments import cli

flags.adopt_module_key_flags(auto_plan_args)


def main(argv: list[str]) -> None:
  cli.no_arguments(argv)
  args = auto_plan_args.from_flags()
  flag = f"--xla_force_host_platform_device_count={args.devices}"
  os.environ["XLA_FLAGS"] = " ".join(
      x for x in (os.environ.get("XLA_FLAGS", ""), flag) if x)
  os.environ.setdefault("JAX_PLATFORMS", "cpu")
  from experiments import auto_plan_lib  # pylint: disable=import-outside-toplevel
  sys.exit(auto_plan_lib.main(args))


if __name__ == "__main__":
  cli.run(main)
