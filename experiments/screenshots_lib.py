"""The work of ``experiments.screenshots`` (its flags are defined and
documented there; its ``main`` imports this module, so that
``--help`` imports no jax, CP-SAT or matplotlib). Reads the
flags it is given (``absl.flags.FLAGS``)."""

from __future__ import annotations

import os

from absl import flags
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from tessel_jax import placements, plot
from tessel_jax.search import baselines, search_repetend


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
  out = flags.FLAGS.output_dir
  os.makedirs(out, exist_ok=True)
  graph = placements.mshape(4)
  run = search_repetend(graph, None).unroll(16)
  grid = run.grid(max_steps=64, width=flags.FLAGS.columns)
  print(grid)
  written = [os.path.join(out, name) for name in (
      "grid_mshape_d4_80col.png", "gantt_mshape_d4.png",
      "compare_mshape_d4_1f1b.png")]
  terminal_png(">>> print(run.grid())\n" + grid,
               written[0], flags.FLAGS.columns)
  plot.gantt(run, written[1])
  plot.compare(run, baselines.run("1f1b", graph, 16), written[2])
  for path in written:
    print(f"wrote {path}")
