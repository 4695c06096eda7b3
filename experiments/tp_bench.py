"""Pipeline x tensor x data on 4 fake CPU devices (8 for
``pipe2_data2_model2``): the README's GPT (with
Megatron MLP layers, wide enough that weights dominate) on several meshes.

  python -m experiments.tp_bench
  python -m experiments.tp_bench --configs=pipe2_model2,pipe2_model2_replicated

For each mesh (``--configs``): step time (median), compile seconds, the
compiled program's argument + output + temp bytes per device
(``compiled.memory_analysis()``), the error against ``jax.value_and_grad``
and, for the pipelined ones, the predicted bytes per device (parameters and
gradients as placed, the batch, the packed parameters and their
accumulators, the schedule's peak stash) and, with ``--cost=measured``
(default), the predicted step time (kernels profiled on one stage's
devices, sharded as they run). Target: ``pipe2_model2`` at most
0.6x the bytes of ``pipe2_model2_replicated``; ``pipe2_data2_fsdp`` (every
weight split over ``data``, ZeRO-3) is to compare with ``pipe2_data2``.
JSON to ``--output``.
"""

import os
import sys

from absl import flags

from experiments import cli
from experiments import tp_bench_args

# --help lists the flags of tp_bench_args (defined there, read by this binary).
flags.adopt_module_key_flags(tp_bench_args)


def main(argv: list[str]) -> None:
  cli.no_arguments(argv)
  args = tp_bench_args.from_flags()
  # XLA reads XLA_FLAGS when jax creates its CPU client (first device use).
  os.environ["XLA_FLAGS"] = " ".join(
      x for x in [os.environ.get("XLA_FLAGS", ""),
                  "--xla_force_host_platform_device_count=8"] if x)
  os.environ.setdefault("JAX_PLATFORMS", "cpu")
  from experiments import tp_bench_lib  # pylint: disable=import-outside-toplevel
  sys.exit(tp_bench_lib.main(args))


if __name__ == "__main__":
  cli.run(main)
