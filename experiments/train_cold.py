"""Cold starts of the README's main job, timed to its first step.

  python -m experiments.train_cold --rounds=2
  python -m experiments.train_cold --rounds=3 \
      --versions=base=/tmp/base_venv/bin/python@/tmp/base,new=python@.

Runs ``python -m experiments.train --placement=mshape --devices=4`` (plus
``--train_args``) in new processes on empty caches and prints, per run, the
wall and process CPU seconds at its first line, at the kernels / profile
lines, when built, when compiled and at step 0 (where the run is stopped).
Several versions (``--versions``: ``label=[python@]checkout``, the same
format as ``experiments.peer_compile``'s; python left out: this
interpreter, checkout left empty: this one) are alternated, shuffled per
round; JSON with every mark of every run goes to ``--output``.
"""

import json
import os
import sys

from absl import flags

from experiments import cli

flags.DEFINE_integer("rounds", 1, "Runs of each version.")
flags.DEFINE_list("versions", [], "Versions compared, " + cli.VERSIONS_HELP
                  + " (default: this=, this interpreter on this checkout).")
flags.DEFINE_list("train_args", ["--placement=mshape", "--devices=4"],
                  "Arguments of experiments.train.")
flags.DEFINE_string("output", None, "JSON file of every run (optional).")


def _versions(entries: list[str]) -> dict[str, tuple[str, str]]:
  """name -> (python, checkout) of ``--versions`` (default: this one)."""
  return {v.label: (v.python or sys.executable,
                    os.path.abspath(v.checkout or os.getcwd()))
          for v in cli.versions(entries or ["this="])}


def main(argv: list[str]) -> None:
  cli.no_arguments(argv)
  f = flags.FLAGS
  cli.at_least(1, "rounds")
  versions = _versions(f.versions)
  if f.output:
    cli.check_created(f.output, "--output")
  from experiments import train_cold_lib  # pylint: disable=import-outside-toplevel
  rows = train_cold_lib.rounds(versions, f.train_args, f.rounds)
  if f.output:
    os.makedirs(os.path.dirname(f.output) or ".", exist_ok=True)
    with open(f.output, "w", encoding="utf-8") as out:
      json.dump(rows, out, indent=1)
    print(f"results: {f.output}")
  sys.exit(1 if any("error" in r for r in rows) else 0)


if __name__ == "__main__":
  cli.run(main)
