"""Same schedules before and after a change of the search's code.

  python -m experiments.search_identity --cases=results/identity_cases.json \
      --output=results/identity_after.json [--compare=results/identity_before.json]

Runs ``search_repetend`` on a fixed list of cases with the CPU-seconds
safety nets lifted (``budget.Budget``'s cap and ``cpsat``'s per-solve net),
so the result depends only on the deterministic budgets, not on the load:
per case the period, status, N = 128 makespan and a digest of the
repetend, the ramp templates and every action of the unrolling. The case
list (``--cases``) is made once if it does not exist: at 4 devices each
of ``--placements`` at its tight, middle, fast and no limit, from the fast
limit's witness repetend for ``--start_placements``, and the fast limit at
8 devices for ``--placements8``; run the old code on the same list (e.g.
from ``git archive`` with ``PYTHONPATH``) and pass its output to
``--compare``.

The same schedules between processes and loads (issue 18): with
``--nolift_caps`` the nets stay (as in every build) and
``--clock_speed=200`` makes the wall clocks run 200 times faster; compare
its output with a plain ``--nolift_caps`` run's (``cut_by_clock`` in every
row says whether a net cut that search).
"""

from __future__ import annotations

from absl import flags

from experiments import cli

flags.DEFINE_string("cases", "results/identity_cases.json",
                    "Case list (made if missing).")
flags.DEFINE_list("placements", ["vshape", "interleaved", "xshape", "mshape",
                                 "kshape", "nnshape_eager", "mllm", "zbv"],
                  "4-device placements (tight, middle, fast, no limit).")
flags.DEFINE_list("start_placements", ["xshape", "nnshape_eager", "zbv",
                                       "alphafold"],
                  "4-device placements also searched from the witness.")
flags.DEFINE_list("placements8", ["xshape", "mllm", "zbv"],
                  "8-device placements at their fast limit.")
flags.DEFINE_float("time_limit", 10.0, "Budget per search (seconds).")
flags.DEFINE_bool("lift_caps", True,
                  "Lift the CPU-seconds safety nets (search.clock): only the"
                  " deterministic budgets decide.")
flags.DEFINE_float("clock_speed", 1.0,
                   "The wall clocks the search could read run this many"
                   " times faster (a loaded machine, simulated): with"
                   " --nolift_caps the schedules must not change.")
flags.DEFINE_string("output", "results/identity.json", "Results JSON.")
flags.DEFINE_string("compare", None, "An earlier output to compare with.")


def main(argv: list[str]) -> None:
  from experiments import search_identity_lib  # pylint: disable=import-outside-toplevel
  search_identity_lib.main(argv)


if __name__ == "__main__":
  cli.run(main)
