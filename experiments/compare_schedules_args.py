"""Flags of ``experiments.compare_schedules``, read into ``CompareArgs``.

Importing this module defines the flags; only the binary imports it.
"""

from __future__ import annotations

from absl import app, flags

from experiments import cli
from experiments.compare_schedules_lib import (MEMORY_CASES, CompareArgs,
                                               check_args)

_D = CompareArgs()

flags.DEFINE_list("placements", None,
                  "Placements (default: every named one plus vshape_split,"
                  " the V-shape with split backward where ZB-H1 applies).")
flags.DEFINE_integer("devices", _D.devices, "Devices on the pipeline axis.")
flags.DEFINE_integer("microbatches", _D.microbatches,
                     "Micro-batches N, simulated and lowered.")
flags.DEFINE_list("memories", list(_D.memories),
                  "Memory cases of the searched schedule: "
                  f"{', '.join(MEMORY_CASES)} (baseline: the smallest peak"
                  " memory of the classic schedules other than GPipe; each: one"
                  " search at every classic schedule's peak memory) or an"
                  " integer limit.")
flags.DEFINE_float("time_limit", _D.time_limit, "CP-SAT budget per search.")
flags.DEFINE_integer("seed", _D.seed, "CP-SAT and model seed.")
flags.DEFINE_bool("lower", _D.lower,
                  "Also lower every schedule to a shard_map program on a CPU"
                  " mesh and time its step.")
flags.DEFINE_integer("hidden", _D.hidden, "Width of the lowered model.")
flags.DEFINE_integer("rows", _D.rows, "Rows per micro-batch (lowered model).")
flags.DEFINE_integer("repeats", _D.repeats,
                     "Timed steps per lowered schedule (median reported).")
flags.DEFINE_bool("check", _D.check,
                  "Check each lowered step against jax.value_and_grad.")
flags.DEFINE_string("output_dir", _D.output_dir,
                    "Folder of the results (run_<hash of the flags>.json).")


def from_flags() -> CompareArgs:
  """Reads the parsed flags into ``CompareArgs``.

  Raises:
    app.UsageError: for malformed or out-of-range flags.
  """
  f = flags.FLAGS
  cli.check_created(f.output_dir, "--output_dir", folder=True)
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
