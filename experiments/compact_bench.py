"""The compact lowering against the default one, paired in one process.

  python -m experiments.compact_bench                  # peer_bench's MLP
  python -m experiments.compact_bench --model=gpt      # the README's GPT

Builds the same searched schedule three ways and times them interleaved
(shuffled order per round, median wall and process CPU per call): the
default lowering (``interpret_ramps=8``: ramps interpreted, steady state a
loop over the repetend), the compact one (``interpret_ramps=0``: every tick
in one table-driven loop, remote messages held until a flush,
``passes.held``) and the compact one with every remote message sent at the
boundary right after its tick (``held.flush_points`` replaced: one
rendezvous per boundary that carries a message, as before the outboxes).
Every program is checked against ``jax.value_and_grad`` first. Prints and
writes compile seconds, HLO size, flush boundaries, wall and CPU ms.
"""

import sys

from absl import flags

from experiments import cli, xla_env
from experiments import compact_bench_args

# --help lists the flags of compact_bench_args (defined there, read by this binary).
flags.adopt_module_key_flags(compact_bench_args)


def main(argv: list[str]) -> None:
  cli.no_arguments(argv)
  args = compact_bench_args.from_flags()
  # XLA reads XLA_FLAGS when jax creates its CPU client (first device use).
  xla_env.add_xla_flags(
      xla_env.cpu_flags(2, single_thread=True) if args.model == "mlp"
      else xla_env.cpu_flags(4), force_platform=True)
  from experiments import compact_bench_lib  # pylint: disable=import-outside-toplevel
  sys.exit(compact_bench_lib.main(args))


if __name__ == "__main__":
  cli.run(main)
