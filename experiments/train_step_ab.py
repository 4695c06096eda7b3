"""The placed ResNet18 ``train_step`` (fused step + sgd update), paired.

  taskset -c 0,1 python -m experiments.train_step_ab --rounds=7

The model, mesh and plan of ``experiments.resnet_ab`` (``vshape(2)``, N = 8,
``param_layout="auto"``, 2 fake single-threaded CPU devices); each variant
of ``experiments.resnet_variants.VARIANTS`` trains with
``step.train_step(optax.sgd)`` from the same parameters, its losses over
two steps checked equal to the first variant's; then every variant takes
one step per round in shuffled order (wall, process CPU and system CPU ms,
minor page faults). Paired ratios are against the first variant.
"""

import sys

from absl import flags

from experiments import cli, train_step_ab_args, xla_env

# --help lists the flags of train_step_ab_args (defined there, read here).
flags.adopt_module_key_flags(train_step_ab_args)


def main(argv: list[str]) -> None:
  cli.no_arguments(argv)
  args = train_step_ab_args.from_flags()
  xla_env.add_xla_flags(xla_env.cpu_flags(2, single_thread=True))
  from experiments import train_step_ab_lib  # pylint: disable=import-outside-toplevel
  sys.exit(train_step_ab_lib.main(args))


if __name__ == "__main__":
  cli.run(main)
