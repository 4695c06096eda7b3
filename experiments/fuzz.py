"""Fuzz the search: random placements searched, unrolled and checked twice.

  python -m experiments.fuzz --cases=2000 --output=fuzz.json

Every schedule goes through the library's validator and an independent
checker written from DESIGN.md §3; infeasibility claims are re-checked at
the claimed smallest limit; ``unroll(N)`` is compared with split
concatenations; a sample is searched again in a second process. Exit code 0
when nothing failed, 1 otherwise.
"""

import sys

from absl import flags

from experiments import cli
from experiments import fuzz_args

# --help lists the flags of fuzz_args (defined there, read by this binary).
flags.adopt_module_key_flags(fuzz_args)


def main(argv: list[str]) -> None:
  cli.no_arguments(argv)
  args = fuzz_args.from_flags()
  from experiments import fuzz_lib  # pylint: disable=import-outside-toplevel
  result = fuzz_lib.run(args)
  print(fuzz_lib.summary(result))
  bad = (result["invalid"] or result["raw_errors"] or result["hangs"]
         or result["infeasible_recheck_failed"] or result["split_longer"]
         or result["determinism_mismatches"])
  sys.exit(1 if bad else 0)


if __name__ == "__main__":
  cli.run(main)
