"""The benchmark: searched schedules vs baselines over all named placements.

  python -m experiments.search_cases --devices=4,8 --modes=train \
      --microbatches=128 --time_limit=30 --markdown=results/cases.md

Writes results/search_cases_<hash of flags>.json (or --output) after every
case and prints the markdown table at the end.
"""

from absl import flags

from experiments import cli
from experiments import runs, search_cases_args

# --help lists the flags of search_cases_args (defined there, read by this binary).
flags.adopt_module_key_flags(search_cases_args)


def main(argv: list[str]) -> None:
  cli.no_arguments(argv)
  args = search_cases_args.from_flags()
  from experiments import search_cases_lib  # pylint: disable=import-outside-toplevel
  results = search_cases_lib.run(args)
  table = search_cases_lib.markdown(results)
  if results["args"]["markdown"]:
    runs.write_text(results["args"]["markdown"], table + "\n")
  print(table)
  print(f"\nwrote {results['output']}")


if __name__ == "__main__":
  cli.run(main)
