"""Time/memory frontier: placements x pipeline x data parallelism x memory.

  python -m experiments.frontier                       # analytic mT5-like GPT
  python -m experiments.frontier --cost_source=measured --memory_limit=none
  python -m experiments.frontier --model=readme_gpt --cost_source=measured \
      --devices=4 --microbatches=8 --gpt_rows=4 --memory_limit=none

Writes results/frontier/run_<hash of the flags>.json; draw it with
``python -m experiments.frontier_plot <that file>``.
"""

from absl import flags

from experiments import cli
from experiments import frontier_args

# --help lists the flags of frontier_args (defined there, read by this binary).
flags.adopt_module_key_flags(frontier_args)


def main(argv: list[str]) -> None:
  cli.no_arguments(argv)
  args = frontier_args.from_flags()
  from experiments import frontier_lib, frontier_program  # pylint: disable=import-outside-toplevel
  if args.model in frontier_program.programs():
    frontier_program.set_device_count(args.devices)
  results = frontier_lib.run(args)
  print(frontier_lib.summary(results))


if __name__ == "__main__":
  cli.run(main)
