"""Paired compile times: the hand GPipe and tessel_jax, on a loaded machine.

  python -m experiments.peer_compile                       # N = 8, 32
  python -m experiments.peer_compile --rounds=11 --ns=8
  python -m experiments.peer_compile --versions=this=,main=/path/to/main

``experiments.peer_bench``'s MLP (``--hidden``, ``--rows``; 4 layers, 2
stages on 2 fake single-threaded CPU devices) built once per worker
process, then compiled afresh once per round (``jax.jit(...).lower(...)``
untimed, ``.compile()`` timed: wall and process CPU seconds), every
(version, variant, N) once per round in a shuffled order. One worker per
code version (``--versions``: ``label=[python@]checkout``, the same
format as ``experiments.train_cold``'s; the worker runs on that
interpreter, default this one, and imports that source tree's
``tessel_jax`` and ``passes``; an empty checkout is this tree), so
versions alternate too. Prints medians, and the paired ratios of
each round (tessel_jax / hand GPipe, version / first version) with their
medians; JSON to ``--output``, a Markdown table beside it.
"""

import os
import sys

# A worker for another code version imports its tessel_jax (set by the
# parent; before anything imports this tree's, which the cwd would give).
if os.environ.get("PEER_COMPILE_TREE"):
  sys.path.insert(0, os.environ["PEER_COMPILE_TREE"])

from absl import app, flags  # pylint: disable=wrong-import-position

from experiments import cli, xla_env  # pylint: disable=wrong-import-position

flags.DEFINE_list("variants", ["hand_gpipe", "tj_compact"],
                  "peer_bench variants to compile (hand_gpipe first gives"
                  " the x hand column).")
flags.DEFINE_list("ns", ["8", "32"], "Micro-batch counts N.")
flags.DEFINE_integer("rounds", 7, "Rounds (each case compiled once per"
                     " round, shuffled).")
flags.DEFINE_list("versions", ["this="], "Versions compared, "
                  + cli.VERSIONS_HELP + ".")
flags.DEFINE_integer("hidden", 1024, "Width of the MLP.")
flags.DEFINE_integer("rows", 256, "Rows per micro-batch.")
flags.DEFINE_integer("seed", 0, "Parameter seed and round order seed.")
flags.DEFINE_string("output", "results/peer_bench/peer_compile.json",
                    "JSON results (a .md table beside it); '': print only.")
flags.DEFINE_bool("worker", False, "Internal: run one worker process.")


def _args():
  from experiments.peer_compile_lib import CompileArgs  # pylint: disable=import-outside-toplevel
  f = flags.FLAGS
  cli.check_created(f.output, "--output", suffixes=(".json",))
  try:
    ns = tuple(int(n) for n in f.ns)
  except ValueError:
    raise app.UsageError(f"--ns must be integers: {f.ns}") from None
  if any(n < 2 or n % 2 for n in ns) or f.rounds < 1:
    raise app.UsageError(f"--ns must be even and >= 2 ({ns}), --rounds >= 1")
  versions = cli.versions(f.versions)
  return CompileArgs(variants=tuple(f.variants), ns=ns, rounds=f.rounds,
                     versions=tuple(versions), hidden=f.hidden, rows=f.rows,
                     seed=f.seed, output=f.output or None)


def main(argv: list[str]) -> None:
  cli.no_arguments(argv)
  if flags.FLAGS.worker:
    xla_env.add_xla_flags(xla_env.cpu_flags(2, single_thread=True),
                          force_platform=True)
  args = _args()
  from experiments import peer_compile_lib  # pylint: disable=import-outside-toplevel
  if flags.FLAGS.worker:
    sys.exit(peer_compile_lib.worker(args))
  sys.exit(peer_compile_lib.main(args))


if __name__ == "__main__":
  cli.run(main)
