"""Tessel's own search on its cases, beside ours: makespans at equal memory.

  python -m experiments.tessel_reference --tessel_repo=/path/to/Tessel \
      --cases=nnshape:3,nnshape:4,nnshape:5,mshape:3,mshape:4 \
      --nmicros=2,3,4 --cpu_limit=300 --output=results/tessel_reference.json

Runs Tessel's ``Composer.compose_n`` (github.com/zhiqi-0/Tessel, a checkout
given by ``--tessel_repo``; it needs ``z3-solver`` and ``more-itertools``,
which this project does not install) unmodified, in a child process per
(placement, memory limit, ``nmicros``) capped at ``--cpu_limit`` CPU
seconds, on its placements of ``examples/simulator/cases_tessel.py`` (4
devices, training). ``nmicros`` is how many micro-batches its repetend
spans (its ``search_ablation_memory.sh`` uses 6). Each schedule is unrolled
with Tessel's own ``SchedPlan.unroll`` to ``--microbatches`` and its step
count is the makespan; the same schedule is also checked by this
project's validator and simulator on ``tessel_cases``'s graph of the case
(``our_valid``, ``our_makespan``). Beside it: our search of the same case
(``search_cases_tessel_lib.run_case``, written from Tessel's description in
``tessel_cases``). No Tessel code is copied into this project.
"""

from __future__ import annotations

from absl import flags

from experiments import cli

flags.DEFINE_string("tessel_repo", None, "A checkout of Tessel's repository.")
flags.DEFINE_list("cases", ["nnshape:3", "nnshape:4", "nnshape:5",
                            "mshape:3", "mshape:4"],
                  "placement:memory_limit pairs (4 devices, training).")
flags.DEFINE_list("nmicros", ["2", "3", "4"],
                  "Tessel's repetend micro-batch spans to try per case.")
flags.DEFINE_integer("microbatches", 128, "Micro-batches N to unroll.")
flags.DEFINE_integer("cpu_limit", 300, "CPU seconds per Tessel search.")
flags.DEFINE_float("time_limit", 10.0, "Our search's budget (seconds).")
flags.DEFINE_string("output", "results/tessel_reference.json",
                    "Results JSON.")
flags.DEFINE_string("worker", None, "Internal: run one Tessel search"
                    " (placement:memory:nmicros:N) and print its JSON.")


def main(argv: list[str]) -> None:
  from experiments import tessel_reference_lib  # pylint: disable=import-outside-toplevel
  tessel_reference_lib.main(argv)


if __name__ == "__main__":
  cli.run(main)
