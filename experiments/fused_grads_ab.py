"""Backward kernels priced with and without their fused gradient adds
(``TESSEL_JAX_FUSED_GRADS``), against the same measured steps.

  TESSEL_JAX_CACHE=$(mktemp -d) python -m experiments.fused_grads_ab
  TESSEL_JAX_CACHE=$(mktemp -d) python -m experiments.fused_grads_ab \\
      --models=hf_gpt2 --rounds=5

Takes ``experiments.model_zoo_spans``' flags (``--cost`` and ``--output``
are not used: always ``cost="measured"``, JSON lines on stdout). See
``experiments.fused_grads_ab_lib``.
"""

import sys

from absl import flags

from experiments import cli, model_zoo_flags, model_zoo_spans_args

flags.adopt_module_key_flags(model_zoo_spans_args)


def main(argv: list[str]) -> None:
  cli.no_arguments(argv)
  model_zoo_flags.two_devices()
  # pylint: disable-next=import-outside-toplevel
  from experiments import fused_grads_ab_lib
  sys.exit(fused_grads_ab_lib.main(model_zoo_spans_args.from_flags()))


if __name__ == "__main__":
  cli.run(main)
