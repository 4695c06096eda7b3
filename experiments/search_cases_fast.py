"""The fast column: search at the smallest limit that keeps the fastest
period, from scratch and from the memory search's repetend.

  python -m experiments.search_cases_fast --placements=nnshape,nnshape_eager \
      --devices=4,8 --time_limit=30 --output=results/search_cases_fast.json

Per placement and device count (training): the fastest period ``P`` (no
limit), then ``smallest_memory_repetend(graph, P)`` (the fast limit and a
repetend at ``P`` under it, timed), then per round, in a shuffled order,
``search_repetend`` at that limit from scratch (``scratch``) and from that
repetend (``start``). Prints period, status, N-makespan, wall and process
CPU seconds per variant; writes the JSON.

With ``--profile`` each row also says where the search's CPU seconds went
(``search_profile_lib``: per step of the search, and every CP-SAT solve
of the modulo model with its step, stage, status, deterministic and CPU
seconds).

With ``--limits`` (e.g. ``nnshape:4:13,nnshape_eager:8:20``) those cases
skip the memory search (minutes of CPU) and run from scratch only, at the
limit given:

  python -m experiments.search_cases_fast --placements=nnshape,nnshape_eager \
      --devices=4,8 --limits=nnshape:4:13,nnshape:8:30,nnshape_eager:4:10,\
nnshape_eager:8:20 --output=/tmp/fast48.json
"""

from __future__ import annotations

from absl import flags

from experiments import cli

flags.DEFINE_list("placements", ["nnshape", "nnshape_eager"], "Placements.")
flags.DEFINE_list("devices", ["4", "8"], "Device counts.")
flags.DEFINE_integer("microbatches", 128, "Micro-batches N to unroll.")
flags.DEFINE_integer("rounds", 1, "Rounds (variants shuffled per round).")
flags.DEFINE_float("time_limit", 30.0, "CP-SAT budget per search (seconds).")
flags.DEFINE_integer("seed", 0, "Seed of the round order.")
flags.DEFINE_string("output", "results/search_cases_fast.json",
                    "Results JSON.")
flags.DEFINE_list("limits", [], "placement:devices:limit of cases whose"
                  " fast limit is known: no memory search, no witness, only"
                  " the search from scratch.")
flags.DEFINE_bool("profile", False, "Record where each search's CPU"
                  " seconds go (per step and per CP-SAT solve) in its row.")
flags.DEFINE_bool("compare_construct", False, "Also run the search from"
                  " scratch without the constructive scheduler"
                  " (``scratch_noconstruct``), with it before the first"
                  " solve (``scratch_first``) and once that solve decided"
                  " nothing (``scratch_after``), interleaved with the"
                  " others in each round.")
flags.DEFINE_string("witnesses", None, "JSON cache of the fast limits and"
                    " witness repetends (read if it exists, written after"
                    " each memory search), so that runs of two versions of"
                    " the search share them.")


def main(argv: list[str]) -> None:
  from experiments import search_cases_fast_lib  # pylint: disable=import-outside-toplevel
  search_cases_fast_lib.main(argv)


if __name__ == "__main__":
  cli.run(main)
