"""Picture of a frontier result file (a separate step from the sweep).

  python -m experiments.frontier_plot results/frontier/run_<hash>.json

Writes ``run_<hash>_frontier.png`` next to each input: every plan as a
point (peak memory per device against step time; one colour per placement,
one marker per pipeline width, hollow for baselines), the Pareto set
joined as a staircase, the device memory the plan was chosen for as a
dashed line and the chosen plan circled. ``plot_frontier(results, stem)``
has the signature of ``plot_results_lib.PLOTTERS`` entries.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

from absl import app

from experiments import cli
from experiments import runs

if TYPE_CHECKING:  # matplotlib is imported when drawing (--help stays cheap)
  from matplotlib.figure import Figure

GIB = 2**30
_MARKERS = ("o", "s", "^", "D", "v", "P", "X", "*")


def _figure(width: float, height: float) -> Figure:
  from matplotlib.backends.backend_agg import FigureCanvasAgg  # pylint: disable=import-outside-toplevel
  from matplotlib.figure import Figure  # pylint: disable=import-outside-toplevel,redefined-outer-name
  fig = Figure(figsize=(width, height), dpi=100)
  FigureCanvasAgg(fig)
  fig.set_layout_engine("constrained")
  return fig


def plot_frontier(results: dict[str, Any], stem: str) -> list[str]:
  """Draws ``results`` (a frontier run) to ``<stem>_frontier.png``."""
  if "program_frontier" in results:
    from experiments import frontier_program  # pylint: disable=import-outside-toplevel
    return frontier_program.plot(results, stem)
  from matplotlib import colormaps  # pylint: disable=import-outside-toplevel
  from matplotlib.lines import Line2D  # pylint: disable=import-outside-toplevel
  from matplotlib.ticker import FuncFormatter  # pylint: disable=import-outside-toplevel
  fr = results["frontier"]
  plans = fr["plans"]
  if not plans:
    raise ValueError(f"{results.get('output', stem)} has no plans to draw")
  names = list(dict.fromkeys(p["placement"] for p in plans))
  pipes = sorted({p["pipe"] for p in plans})
  colours = {n: colormaps["tab10"](i % 10) for i, n in enumerate(names)}
  markers = {w: _MARKERS[i % len(_MARKERS)] for i, w in enumerate(pipes)}
  peaks = [p["peak_bytes"] for p in plans]
  unit, scale = (("GiB", GIB) if max(peaks) >= GIB else ("MiB", 2**20)
                 if max(peaks) >= 2**20 else ("KiB", 2**10))
  fig = _figure(9, 6)
  ax = fig.add_subplot()
  for p in plans:
    base = p["memory_case"] == "baseline"
    ax.scatter(p["peak_bytes"] / scale, p["step_seconds"] * 1e3,
               marker=markers[p["pipe"]], s=36,
               facecolors="none" if base else colours[p["placement"]],
               edgecolors=colours[p["placement"]], linewidths=1.2,
               alpha=0.85, zorder=3)
  front = sorted((plans[i] for i in fr["pareto"]),
                 key=lambda p: p["peak_bytes"])
  xs, ys = [], []
  for p in front:                       # staircase: memory up, time down
    x, y = p["peak_bytes"] / scale, p["step_seconds"] * 1e3
    if ys:
      xs.append(x)
      ys.append(ys[-1])
    xs.append(x)
    ys.append(y)
  ax.plot(xs, ys, color="black", linewidth=1.2, zorder=2,
          label=f"Pareto set ({len(fr['pareto'])} plans)")
  limit = fr["memory_limit_bytes"]
  if limit is not None:
    ax.axvline(limit / scale, color="grey", linestyle="--", linewidth=1,
               label=f"device memory {limit / scale:.4g} {unit}")
  if fr["chosen"] is not None:
    c = plans[fr["chosen"]]
    ax.scatter(c["peak_bytes"] / scale, c["step_seconds"] * 1e3, s=260,
               facecolors="none", edgecolors="red", linewidths=2, zorder=4,
               label=f"chosen: {c['label']}")
    ax.annotate(f"{c['label']}\n{c['step_seconds'] * 1e3:.4g} ms,"
                f" {c['peak_bytes'] / scale:.3g} {unit}",
                (c["peak_bytes"] / scale, c["step_seconds"] * 1e3),
                textcoords="offset points", xytext=(14, 18), fontsize=8,
                color="red", zorder=5,
                bbox={"boxstyle": "round", "fc": "white", "ec": "red",
                      "alpha": 0.9})
  if max(peaks) > 8 * min(peaks):
    ax.set_xscale("log")
  steps = [p["step_seconds"] for p in plans]
  if max(steps) > 4 * min(steps):
    ax.set_yscale("log")
  plain = FuncFormatter(lambda v, _: f"{v:g}")
  for axis in (ax.xaxis, ax.yaxis):
    axis.set_major_formatter(plain)
    axis.set_minor_formatter(plain)
  ax.set_xlabel(f"peak memory per device ({unit})")
  ax.set_ylabel("step time (ms)")
  model = results.get("model", {})
  args = results.get("args", {})
  ax.set_title(f"time/memory frontier: {model.get('name', '?')}"
               f" ({model.get('source', '?')} costs), {args.get('devices')}"
               f" devices, {args.get('microbatches')} micro-batches")
  ax.grid(True, alpha=0.3)
  handles = [Line2D([], [], color=colours[n], marker="o", linestyle="",
                    label=n) for n in names]
  handles += [Line2D([], [], color="grey", marker=markers[w], linestyle="",
                     label=f"pipe {w}") for w in pipes]
  handles.append(Line2D([], [], color="grey", marker="o", linestyle="",
                        markerfacecolor="none", label="baseline schedule"))
  first = ax.legend(handles=handles, loc="upper right", fontsize=8, ncol=2)
  ax.add_artist(first)
  ax.legend(loc="upper center", fontsize=8)
  path = f"{stem}_frontier.png"
  fig.savefig(path, dpi=100)
  return [path]


def plot_file(path: str, output_dir: str | None = None) -> list[str]:
  """Reads a frontier result file and draws it next to it (or in
  ``output_dir``).

  Raises:
    ValueError: if the file is not a frontier result.
  """
  return runs.plot_file(path, "frontier", plot_frontier, output_dir)


def main(argv: list[str]) -> None:
  if len(argv) < 2:
    raise app.UsageError("give result files: python -m"
                         " experiments.frontier_plot results/frontier/"
                         "run_<hash>.json")
  for path in argv[1:]:  # every picture's place, before drawing any
    cli.check_created(f"{os.path.splitext(path)[0]}_frontier.png", "picture")
  for path in argv[1:]:
    for picture in plot_file(path):
      print(f"wrote {picture}")


if __name__ == "__main__":
  cli.run(main)
