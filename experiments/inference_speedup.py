"""Pipelined inference of the GPT against the same batch on one device.

  python -m experiments.inference_speedup              # vshape, mllm, xshape
  python -m experiments.inference_speedup --rounds=3 --placements=vshape

The large-vocabulary GPT of ``experiments.inference`` (tied head) scores a
batch of ``--microbatches`` micro-batches: unpipelined on one device pinned
to one core and on one device given both cores, and pipelined on 2 fake
single-threaded CPU devices on both cores (``mode="infer"``,
``cost="measured"``) for each placement. Every variant is timed once per
round in shuffled order; rounds where the rest of the machine was busy are
dropped (see ``experiments.inference_speedup_lib``). Writes JSON to
``--output`` and a Markdown table beside it: wall and CPU ms, ratios to the
plain runs, predicted against measured, outputs' error.
"""

import sys

from absl import flags

from experiments import cli
from experiments import inference_speedup_args

# --help lists the flags of inference_speedup_args (defined there).
flags.adopt_module_key_flags(inference_speedup_args)


def main(argv: list[str]) -> None:
  cli.no_arguments(argv)
  args = inference_speedup_args.from_flags()
  # The parent sets each worker's XLA_FLAGS before its jax starts.
  from experiments import inference_speedup_lib  # pylint: disable=import-outside-toplevel
  sys.exit(inference_speedup_lib.main(args))


if __name__ == "__main__":
  cli.run(main)
