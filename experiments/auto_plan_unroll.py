"""Cost of ``Schedule.unroll(N)`` for the small ``N`` of ``placement="auto"``.

  python -m experiments.auto_plan_unroll --rounds=3 \
      --output=results/auto_plan/unroll.json
  python -m experiments.auto_plan --memory_limits= \
      --record_searches=results/auto_plan/searches.json
  python -m experiments.auto_plan_unroll \
      --searches=results/auto_plan/searches.json --rounds=3

A cold ``placement="auto"`` choice searches one schedule per plan and
unrolls it for the plan's few micro-batches per pipeline (README GPT, 4
devices, N = 8: 4 or 8). For ``N <= schedule.SPLIT_MICROBATCHES`` the
unrolling also tries every split ``unroll(a) + unroll(N - a)``, each small
``N`` solved whole by CP-SAT (``completion.complete_all``). This runner
searches each case once (uniform spans of the given placements at the given
pipeline widths, with no memory limit, the tightest one and one halfway
between it and the unlimited schedule's peak, or the search
graphs of a real choice given with ``--searches``: a JSON list of
``{graph: BlockGraph dict, limit, time_limit_s, microbatches}``, as
``python -m experiments.auto_plan --record_searches=PATH`` writes), then
per round, in a
shuffled order, times ``unroll(N)`` on a fresh copy of the schedule:

* ``before``: every split candidate, each small ``N`` by CP-SAT with its
  whole budget (``unroll`` as it was before its lower-bound cut-offs);
* ``now``: ``Schedule.unroll`` as it is.

Prints wall and process CPU seconds per variant (summed over the cases,
median over rounds), the makespans of both and the lower bound, and writes
the JSON.
"""

from __future__ import annotations

from absl import flags

from experiments import cli

flags.DEFINE_list("placements", ["vshape", "interleaved", "mshape", "mllm",
                                 "zbv"], "Placements.")
flags.DEFINE_list("pipes", ["2", "4"], "Devices per pipeline.")
flags.DEFINE_string("searches", None,
                    "JSON list of recorded searches ({graph, limit,"
                    " time_limit_s, microbatches}) instead of the placements.")
flags.DEFINE_integer("rounds", 3, "Timed rounds (variants shuffled per round).")
flags.DEFINE_float("time_limit", 1.0, "CP-SAT budget per search (seconds).")
flags.DEFINE_integer("seed", 0, "Seed of the round order.")
flags.DEFINE_string("output", "results/auto_plan/unroll.json", "Results JSON.")


def main(argv: list[str]) -> None:
  from experiments import auto_plan_unroll_lib  # pylint: disable=import-outside-toplevel
  auto_plan_unroll_lib.main(argv)


if __name__ == "__main__":
  cli.run(main)
