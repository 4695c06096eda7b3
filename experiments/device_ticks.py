"""What a tick of the lowered program costs on one accelerator.

  python -m experiments.device_ticks                 # GPU if there is one
  python -m experiments.device_ticks --ns=8 --rounds=3 --noprofile

On ``jax.devices()[0]``: the loop's and the switch's own cost per tick
(a tiny carry), then the issue's MLP (4 x ``tanh(h @ W + b)``, width
1024, 256 rows per micro-batch) trained one step by plain ``jax.jit``,
by a ``lax.scan`` gradient accumulation over the micro-batches and by
tessel_jax's lowered tick program on a one-device mesh (every layer a
block: compact and loop forms, GPipe order), each checked against
``jax.value_and_grad``; then one ``cost="measured"`` build (the block
profiles on this backend, the predicted step). A pipeline needs several
devices; on one this times what a tick itself costs beside the same
kernels run by a plain loop. See ``experiments.device_ticks_lib``.
"""

import sys

from absl import flags

from experiments import cli
from experiments import device_ticks_args

# --help lists the flags of device_ticks_args (defined there).
flags.adopt_module_key_flags(device_ticks_args)


def main(argv: list[str]) -> None:
  cli.no_arguments(argv)
  args = device_ticks_args.from_flags()
  from experiments import device_ticks_lib  # pylint: disable=import-outside-toplevel
  sys.exit(device_ticks_lib.main(args))


if __name__ == "__main__":
  cli.run(main)
