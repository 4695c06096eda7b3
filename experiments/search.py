"""Search one placement's schedule: print, check, save, plot.

  python -m experiments.search --placement=mshape --devices=4 --memory=6 \
      --microbatches=128 --output=out.json --plot=out.png

Exit codes: 0 ok, 1 bad placement or nothing found in time, 2 no schedule
fits under --memory (the smallest limit that works is printed).
"""

import sys

from absl import flags

from experiments import cli
from experiments import search_args

# --help lists the flags of search_args (defined there, read by this binary).
flags.adopt_module_key_flags(search_args)


def main(argv: list[str]) -> None:
  cli.no_arguments(argv)
  args = search_args.from_flags()
  from experiments import search_lib  # pylint: disable=import-outside-toplevel
  sys.exit(search_lib.main(args))


if __name__ == "__main__":
  cli.run(main)
