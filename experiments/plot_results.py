"""Pictures of evaluation results (a separate step from running them).

  python -m experiments.plot_results \
      --input=results/search_scaling/run_<hash>.json

Writes run_<hash>_<what>.png next to each input (or into --output_dir).
"""

from absl import flags

from experiments import cli
from experiments import plot_results_args

# --help lists the flags of plot_results_args (defined there, read by this binary).
flags.adopt_module_key_flags(plot_results_args)


def main(argv: list[str]) -> None:
  cli.no_arguments(argv)
  args = plot_results_args.from_flags()
  from experiments import plot_results_lib  # pylint: disable=import-outside-toplevel
  for picture in plot_results_lib.run(args):
    print(f"wrote {picture}")


if __name__ == "__main__":
  cli.run(main)
