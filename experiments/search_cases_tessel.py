"""The search on the cases of Tessel's own evaluation (``tessel_cases``).

  python -m experiments.search_cases_tessel --time_limit=10 \
      --output=results/search_cases_tessel.json

Per case (Tessel's placement, device count, mode and memory limit): the
searched schedule unrolled to ``N`` micro-batches (validated, its peak
within the limit), its makespan against ``simulate``'s shared lower bound
(no schedule, Tessel's included, is shorter), the gap in percent, and the
search's wall and process CPU seconds. Where the makespan equals the bound
the search is at least as good as Tessel's at equal memory; elsewhere the
gap bounds how much shorter Tessel's could be. Tessel's own makespans are
not public (see ``tessel_cases``); ``tessel_reference`` runs its search
beside ours where the bound does not decide.
"""

from __future__ import annotations

import json
import os

from absl import flags

from experiments import cli, tessel_cases

flags.DEFINE_integer("microbatches", 128, "Micro-batches N to unroll.")
flags.DEFINE_float("time_limit", 10.0, "CP-SAT budget per search (seconds).")
flags.DEFINE_bool("allow_wrap", True, "Let blocks wrap the period end"
                  " (Tessel keeps every block inside one period: --noallow_wrap"
                  " searches only its space).")
flags.DEFINE_list("scripts", None, "Only the cases of these Tessel scripts"
                  " (search_tessel, search_ablation_memory, simu_fast_scale,"
                  " simu_lazy_scale); default: all.")
flags.DEFINE_string("output", "results/search_cases_tessel.json",
                    "Results JSON.")


def main(argv: list[str]) -> None:
  cli.no_arguments(argv)
  f = flags.FLAGS
  cli.check_created(f.output, "--output", suffixes=(".json",))
  # The search (CP-SAT) is imported once the flags are good: --help stays
  # cheap.
  from experiments.search_cases_tessel_lib import markdown, run_case  # pylint: disable=import-outside-toplevel
  rows = []
  for name, devices, train, memory, script in tessel_cases.cases():
    if f.scripts and script not in f.scripts:
      continue
    row = run_case(name, devices, train, memory, f.microbatches,
                   f.time_limit, f.allow_wrap)
    row["script"] = script
    rows.append(row)
    print(json.dumps(row), flush=True)
  folder = os.path.dirname(f.output)
  if folder:
    os.makedirs(folder, exist_ok=True)
  with open(f.output, "w") as out:
    json.dump({"args": {k: getattr(f, k) for k in (
        "microbatches", "time_limit", "allow_wrap", "scripts")},
               "load_average": os.getloadavg(), "cases": rows}, out, indent=1)
  print(markdown(rows))
  print(f"wrote {f.output}")


if __name__ == "__main__":
  cli.run(main)
