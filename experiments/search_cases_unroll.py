"""Cost of ``Schedule.unroll(N)`` with the portfolio of alternatives.

  python -m experiments.search_cases_unroll --devices=32 --microbatches=128 \
      --rounds=3 --output=results/search_cases_unroll.json

Each placement (training, no memory limit, or ``--memories=tight``) is
searched once; then, per round and in a shuffled order, its ``unroll(N)``
is timed three ways on fresh copies of the schedule:

* ``before``: the repetend's unrolling, the list schedule and every classic
  schedule, as ``unroll`` did before ``portfolio`` skipped and cached work;
* ``cold``: ``unroll`` now, its caches emptied;
* ``warm``: ``unroll`` now on another copy (the caches of an earlier
  schedule of the same graph, limit and ``N``, as in a frontier or
  ``placement="auto"`` sweep).

Prints wall and process CPU seconds per variant (median over rounds) and
checks that all three give the same makespan; writes the JSON.
"""

from __future__ import annotations

from absl import flags

from experiments import cli

flags.DEFINE_list("placements", None, "Placements (default: every one).")
flags.DEFINE_integer("devices", 32, "Devices on the pipeline axis.")
flags.DEFINE_enum("memories", "loose", ["loose", "tight"],
                  "No memory limit, or the smallest that admits a schedule.")
flags.DEFINE_integer("microbatches", 128, "Micro-batches N.")
flags.DEFINE_integer("rounds", 3, "Timed rounds (variants shuffled per round).")
flags.DEFINE_float("time_limit", 10.0, "CP-SAT budget per search (seconds).")
flags.DEFINE_integer("seed", 0, "Seed of the round order.")
flags.DEFINE_string("output", "results/search_cases_unroll.json",
                    "Results JSON.")


def main(argv: list[str]) -> None:
  from experiments import search_cases_unroll_lib  # pylint: disable=import-outside-toplevel
  search_cases_unroll_lib.main(argv)


if __name__ == "__main__":
  cli.run(main)
