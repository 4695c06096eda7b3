"""Flags of ``experiments.compare_schedules``, read into ``CompareArgs``.

Importing this module defines the flags; only the binary imports it. It imports
no jax (``from_flags`` imports ``compare_schedules_lib`` once the flags are
checked), so ``--help`` stays cheap.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from absl import app, flags

from experiments import cli

if TYPE_CHECKING:
  from experiments.compare_schedules_lib import CompareArgs


flags.DEFINE_list("placements", None,
                  "Placements (default: every named one plus vshape_split,"
                  " the V-shape with split backward where ZB-H1 applies).")
flags.DEFINE_integer("devices", 4, "Devices on the pipeline axis.")
flags.DEFINE_integer("microbatches", 16,
                     "Micro-batches N, simulated and lowered.")
flags.DEFINE_list("memories", ["loose", "baseline"],
                  "Memory cases of the searched schedule: loose,"
                  " baseline, each, tight, fast (baseline: the smallest peak"
                  " memory of the classic schedules other than GPipe; each: one"
                  " search at every classic schedule's peak memory) or an"
                  " integer limit.")
flags.DEFINE_float("time_limit", 10.0, "CP-SAT budget per search.")
flags.DEFINE_integer("seed", 0, "CP-SAT and model seed.")
flags.DEFINE_bool("lower", True,
                  "Also lower every schedule to a shard_map program on a CPU"
                  " mesh and time its step.")
flags.DEFINE_integer("hidden", 128, "Width of the lowered model.")
flags.DEFINE_integer("rows", 16, "Rows per micro-batch (lowered model).")
flags.DEFINE_integer("repeats", 5,
                     "Timed steps per lowered schedule (median reported).")
flags.DEFINE_bool("check", True,
                  "Check each lowered step against jax.value_and_grad.")
flags.DEFINE_string("output_dir", "results/compare_schedules",
                    "Folder of the results (run_<hash of the flags>.json).")


def from_flags() -> CompareArgs:
  """Reads the parsed flags into ``CompareArgs``.

  Raises:
    app.UsageError: for malformed or out-of-range flags.
  """
  f = flags.FLAGS
  cli.check_created(f.output_dir, "--output_dir", folder=True)
  from experiments.compare_schedules_lib import CompareArgs, check_args  # pylint: disable=import-outside-toplevel
  args = CompareArgs(
      placements=tuple(f.placements) if f.placements else None,
      devices=f.devices, microbatches=f.microbatches,
      memories=tuple(f.memories), time_limit=f.time_limit, seed=f.seed,
      lower=f.lower, hidden=f.hidden, rows=f.rows, repeats=f.repeats,
      check=f.check, output_dir=f.output_dir)
  try:
    check_args(args)
  except ValueError as e:
    raise app.UsageError(str(e)) from None
  return args
