"""Search time and quality against devices, memory limit, N and time limit.

  python -m experiments.search_scaling                       # the full sweep
  python -m experiments.search_scaling --parts=devices --placements=vshape

Writes results/search_scaling/run_<hash of the flags>.json after every case;
plot it with ``python -m experiments.plot_results --input=<that file>``.
"""

from absl import flags

from experiments import cli
from experiments import search_scaling_args

# --help lists the flags of search_scaling_args (defined there, read by this binary).
flags.adopt_module_key_flags(search_scaling_args)


def main(argv: list[str]) -> None:
  cli.no_arguments(argv)
  args = search_scaling_args.from_flags()
  from experiments import search_scaling_lib  # pylint: disable=import-outside-toplevel
  results = search_scaling_lib.run(args)
  print(search_scaling_lib.summary(results))


if __name__ == "__main__":
  cli.run(main)
