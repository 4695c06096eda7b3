"""Screenshots of a schedule as a newcomer sees it: terminal grid and PNG.

  python -m experiments.screenshots --output_dir=experiments/figures

Searches M-shape on 4 devices (N = 16, no memory limit) and writes
``grid_mshape_d4_80col.png`` (the text grid as an 80-column terminal shows
it, rendered with matplotlib in a monospace font),
``gantt_mshape_d4.png`` (the schedule picture) and
``compare_mshape_d4_1f1b.png`` (searched against 1F1B, ``plot.compare``).
"""

from __future__ import annotations

import os

from absl import flags
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from experiments import cli
from tessel_jax import placements, plot
from tessel_jax.search import baselines, search_repetend

_OUTPUT_DIR = flags.DEFINE_string(
    "output_dir", "experiments/figures", "Folder for the three PNG files.")
_COLUMNS = flags.DEFINE_integer("columns", 80, "Terminal width of the grid.")


def terminal_png(text: str, path: str, columns: int) -> None:
  """Draws ``text`` as a dark terminal ``columns`` characters wide."""
  lines = text.splitlines()
  char_w, line_h = 0.0765, 0.152   # inches per character / line at 9 pt
  fig = Figure(figsize=(columns * char_w + 0.3, len(lines) * line_h + 0.3),
               dpi=110)
  FigureCanvasAgg(fig)
  fig.patch.set_facecolor("#1e1e1e")
  fig.text(0.15 / fig.get_figwidth(), 1 - 0.15 / fig.get_figheight(),
           "\n".join(lines), family="monospace", fontsize=9, color="#d4d4d4",
           va="top", ha="left", linespacing=1.2)
  fig.savefig(path, facecolor=fig.get_facecolor())


def main(argv: list[str]) -> None:
  del argv
  out = _OUTPUT_DIR.value
  os.makedirs(out, exist_ok=True)
  graph = placements.mshape(4)
  run = search_repetend(graph, None).unroll(16)
  grid = run.grid(max_steps=64, width=_COLUMNS.value)
  print(grid)
  written = [os.path.join(out, name) for name in (
      "grid_mshape_d4_80col.png", "gantt_mshape_d4.png",
      "compare_mshape_d4_1f1b.png")]
  terminal_png(">>> print(run.grid())\n" + grid,
               written[0], _COLUMNS.value)
  plot.gantt(run, written[1])
  plot.compare(run, baselines.run("1f1b", graph, 16), written[2])
  for path in written:
    print(f"wrote {path}")


if __name__ == "__main__":
  cli.run(main)
