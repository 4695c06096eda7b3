"""Measure the cost model: predicted vs measured step time, profiling cost.

  python -m experiments.cost_bench                    # both parts
  python -m experiments.cost_bench --parts=accuracy --microbatches=8

Parts (JSON to --output, a markdown table on stdout):

* accuracy: for each placement x N, a worker process with 2 fake CPU devices,
  each single-threaded and pinned to one core (as lowering_bench's speed-up
  part), builds the pipelined step with measured costs, compiles it and
  compares ``step.report.predicted_step_ms`` with the median measured step
  time (target: within 15%);
* profiling: seconds spent profiling a 12-layer small GPT (one block per
  layer) with a cold cache and with the cache filled (targets: <= 20 s, ~0).
"""

import sys

from absl import flags

from experiments import cli, xla_env
from experiments import cost_bench_args

# --help lists the flags of cost_bench_args (defined there, read by this binary).
flags.adopt_module_key_flags(cost_bench_args)


def main(argv: list[str]) -> None:
  cli.no_arguments(argv)
  args = cost_bench_args.from_flags()
  # XLA reads XLA_FLAGS when jax creates its CPU client (first device use).
  if args.worker is not None:
    xla_env.add_xla_flags(xla_env.cpu_flags(2, single_thread=True))
  else:
    xla_env.add_xla_flags(xla_env.cpu_flags(max(args.gpt_devices, 8)))
  from experiments import cost_bench_lib  # pylint: disable=import-outside-toplevel
  sys.exit(cost_bench_lib.main(args))


if __name__ == "__main__":
  cli.run(main)
