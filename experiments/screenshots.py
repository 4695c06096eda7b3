"""Screenshots of a schedule as a newcomer sees it: terminal grid and PNG.

  python -m experiments.screenshots --output_dir=experiments/figures

Searches M-shape on 4 devices (N = 16, no memory limit) and writes
``grid_mshape_d4_80col.png`` (the text grid as an 80-column terminal shows
it, rendered with matplotlib in a monospace font),
``gantt_mshape_d4.png`` (the schedule picture) and
``compare_mshape_d4_1f1b.png`` (searched against 1F1B, ``plot.compare``).
"""

from __future__ import annotations

from absl import flags

from experiments import cli

_OUTPUT_DIR = flags.DEFINE_string(
    "output_dir", "experiments/figures", "Folder for the three PNG files.")
_COLUMNS = flags.DEFINE_integer("columns", 80, "Terminal width of the grid.")


def main(argv: list[str]) -> None:
  from experiments import screenshots_lib  # pylint: disable=import-outside-toplevel
  screenshots_lib.main(argv)


if __name__ == "__main__":
  cli.run(main)
