"""The searched schedule against GPipe, 1F1B, interleaved, Chimera, ZB-H1.

  python -m experiments.compare_schedules                    # every placement
  python -m experiments.compare_schedules --placements=vshape,xshape --nolower

Simulated (makespan, bubbles, peak memory) and lowered on a CPU mesh of
fake devices (step time). Writes results/compare_schedules/run_<hash>.json;
plot it with ``python -m experiments.plot_results --input=<that file>``.
"""

import os

from absl import flags

from experiments import cli
from experiments import compare_schedules_args

# --help lists the flags of compare_schedules_args (defined there, read by this binary).
flags.adopt_module_key_flags(compare_schedules_args)


def main(argv: list[str]) -> None:
  cli.no_arguments(argv)
  args = compare_schedules_args.from_flags()
  # XLA reads XLA_FLAGS when JAX creates its CPU client: set it first.
  flag = f"--xla_force_host_platform_device_count={args.devices}"
  os.environ["XLA_FLAGS"] = " ".join(
      x for x in (os.environ.get("XLA_FLAGS", ""), flag) if x)
  os.environ.setdefault("JAX_PLATFORMS", "cpu")
  from experiments import compare_schedules_lib  # pylint: disable=import-outside-toplevel
  results = compare_schedules_lib.run(args)
  print(f"wrote {results['output']} ({results['wall_seconds']:.1f} s)")


if __name__ == "__main__":
  cli.run(main)
