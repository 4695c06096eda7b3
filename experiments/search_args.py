"""Flags of ``python -m experiments.search``, read into ``SearchArgs``.

Importing this module defines the flags; only the binary imports it. It imports
no jax (``from_flags`` imports ``search_lib`` once the flags are checked), so
``--help`` stays cheap.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from absl import app, flags

from experiments import cli
from tessel_jax import checks

if TYPE_CHECKING:
  from experiments.search_lib import SearchArgs

flags.DEFINE_string("placement", None,
                    "Named placement (vshape, xshape, mshape, ...); see"
                    " tessel_jax.placements.PLACEMENTS.")
flags.DEFINE_string("placement_file", None,
                    "Placement JSON (DESIGN.md §4) instead of --placement.")
flags.DEFINE_integer("devices", 4, "Devices on the pipeline axis.")
flags.DEFINE_enum("mode", "train", ["train", "infer"],
                  "Training (F+B blocks, memory) or inference (F only).")
flags.DEFINE_integer("memory", None,
                     "Per-device memory limit in the placement's units"
                     " (default: unlimited).")
flags.DEFINE_integer("microbatches", 128, "Micro-batches N to unroll.")
flags.DEFINE_integer("f_span", None, "Span of a forward block (default: the"
                     " placement's).")
flags.DEFINE_integer("b_span", None, "Span of a backward block (default: the"
                     " placement's).")
flags.DEFINE_bool("no_wrap", False,
                  "Keep every block inside one period (Tessel's rule); by"
                  " default blocks may wrap around the period end.")
flags.DEFINE_float("time_limit", 30.0, "CP-SAT time limit in seconds.")
flags.DEFINE_integer("seed", 0, "CP-SAT random seed.")
flags.DEFINE_integer("workers", 1, "CP-SAT subsolvers (interleaved deterministically).")
flags.DEFINE_string("output", None, "Write the schedule JSON here.")
flags.DEFINE_string("plot", None, "Write a Gantt chart here (.png/.svg/.pdf).")
flags.DEFINE_integer("plot_steps", -1,
                     "Steps the Gantt chart shows: -1 the warmup and four"
                     " periods, 0 the whole schedule.")
flags.DEFINE_string("trace", None, "Write a Chrome/Perfetto trace JSON here.")
flags.DEFINE_integer("grid_steps", 64,
                     "Steps of the text grid to print (0: no grid).")
flags.DEFINE_bool("timing", True,
                  "Report search seconds; --notiming gives byte-identical"
                  " output for the same flags.")


def from_flags() -> SearchArgs:
  """Reads the parsed flags into ``SearchArgs``.

  Raises:
    app.UsageError: for contradictory or out-of-range flags.
  """
  f = flags.FLAGS
  if (f.placement is None) == (f.placement_file is None):
    raise app.UsageError("give exactly one of --placement=NAME or"
                         " --placement_file=PATH")
  if f.placement_file is not None:
    ignored = [f"--{n}" for n in ("devices", "mode", "f_span", "b_span")
               if cli.given(n)]
    if ignored:
      raise app.UsageError(
          f"{', '.join(ignored)} {'does' if len(ignored) == 1 else 'do'} not"
          " apply with --placement_file (the"
          " file fixes devices, mode and spans); drop them or use"
          " --placement=NAME")
  try:
    checks.integer(f.devices, "--devices", low=1, high=checks.MAX_DEVICES)
    checks.microbatches(f.microbatches, field="--microbatches")
    checks.integer(f.workers, "--workers", low=1, high=64)
    checks.memory_limit(f.memory, "--memory")
    checks.time_limit(f.time_limit, "--time_limit")
    for name in ("f_span", "b_span"):
      if getattr(f, name) is not None:
        checks.integer(getattr(f, name), f"--{name}", low=1,
                       high=checks.MAX_SPAN)
  except checks.InputError as err:
    raise app.UsageError(str(err)) from None
  cli.check_output(f.output, "--output")
  cli.check_output(f.plot, "--plot", checks.IMAGE_SUFFIXES)
  cli.check_output(f.trace, "--trace")
  from experiments.search_lib import SearchArgs  # pylint: disable=import-outside-toplevel
  return SearchArgs(
      placement=f.placement, placement_file=f.placement_file,
      devices=f.devices, mode=f.mode, memory=f.memory,
      microbatches=f.microbatches, f_span=f.f_span, b_span=f.b_span,
      allow_wrap=not f.no_wrap, time_limit=f.time_limit, seed=f.seed, workers=f.workers,
      output=f.output, plot=f.plot, plot_steps=f.plot_steps, trace=f.trace,
      grid_steps=max(0, f.grid_steps), timing=f.timing)
