"""Flags of ``python -m experiments.plot_results``, read into ``PlotArgs``.

Importing this module defines the flags; only the binary imports it.
"""

from __future__ import annotations

from absl import app, flags

from experiments.plot_results_lib import PlotArgs

flags.DEFINE_list("input", None,
                  "Result files (run_<hash>.json) of search_scaling or"
                  " compare_schedules.")
flags.DEFINE_string("output_dir", None,
                    "Folder of the pictures (default: next to each input).")


def from_flags() -> PlotArgs:
  """Reads the parsed flags into ``PlotArgs``.

  Raises:
    app.UsageError: without --input.
  """
  f = flags.FLAGS
  if not f.input:
    raise app.UsageError("give --input=<run_<hash>.json>[,...] (written by"
                         " experiments.search_scaling or"
                         " experiments.compare_schedules)")
  return PlotArgs(inputs=tuple(f.input), output_dir=f.output_dir)
