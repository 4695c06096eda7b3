"""Flags of ``python -m experiments.plot_results``, read into ``PlotArgs``.

Importing this module defines the flags; only the binary imports it. It imports
no matplotlib (``from_flags`` imports ``plot_results_lib`` once the flags are
checked), so ``--help`` stays cheap.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import os

from absl import app, flags

from experiments import cli

if TYPE_CHECKING:
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
  cli.check_created(f.output_dir, "--output_dir", folder=True)
  if not f.input:
    raise app.UsageError("give --input=<run_<hash>.json>[,...] (written by"
                         " experiments.search_scaling or"
                         " experiments.compare_schedules)")
  if not f.output_dir:  # pictures go next to each input
    for path in f.input:
      cli.check_created(os.path.dirname(path) or ".", "pictures folder (next"
                        " to --input; or give --output_dir)", folder=True)
  from experiments.plot_results_lib import PlotArgs  # pylint: disable=import-outside-toplevel
  return PlotArgs(inputs=tuple(f.input), output_dir=f.output_dir)
