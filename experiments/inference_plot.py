"""Picture of an inference result file (a separate step from the run).

  python -m experiments.inference_plot results/inference/run_<hash>.json

Writes ``run_<hash>_inference.png`` next to each input: for every number
of micro-batches N, bars per placement of the batch latency (the layer
model, the cost model's prediction on this CPU and on dedicated devices,
the measured lowered program) and of its change against the V-shape in
percent. ``plot_inference(results,
stem)`` has the signature of ``plot_results_lib.PLOTTERS`` entries.
"""

from __future__ import annotations

from typing import Any

from absl import app

from experiments import cli
from experiments import runs

_SERIES = (("layer_model_ms", "layer model (dedicated devices)", "#8172b2"),
           ("predicted_ms", "predicted (this CPU)", "#4c72b0"),
           ("dedicated_ms", "predicted (dedicated devices)", "#55a868"),
           ("measured_ms", "measured (lowered program)", "#c44e52"))


def plot_inference(results: dict[str, Any], stem: str) -> list[str]:
  """Draws ``results`` (an inference run) to ``<stem>_inference.png``."""
  rows = [r for r in results["rows"] if "error" not in r]
  if not rows:
    raise ValueError(f"{results.get('output', stem)} has no successful case"
                     " to draw")
  # matplotlib is imported when drawing (--help stays cheap).
  from matplotlib.backends.backend_agg import FigureCanvasAgg  # pylint: disable=import-outside-toplevel
  from matplotlib.figure import Figure  # pylint: disable=import-outside-toplevel
  ns = list(dict.fromkeys(r["microbatches"] for r in rows))
  fig = Figure(figsize=(12, 3.8 * len(ns)), dpi=100)
  FigureCanvasAgg(fig)
  fig.set_layout_engine("constrained")
  axes = fig.subplots(len(ns), 2, squeeze=False)
  change = {(c["placement"], c["microbatches"]): c
            for c in results.get("changes", [])}
  width = 0.2
  for (left, right), n in zip(axes, ns):
    group = [r for r in rows if r["microbatches"] == n]
    names = [r["placement"] for r in group]
    xs = range(len(group))
    for k, (key, label, colour) in enumerate(_SERIES):
      vals = [r.get(key, 0.0) for r in group]
      if not any(vals):
        continue
      shift = (k - (len(_SERIES) - 1) / 2) * width
      bars = left.bar([x + shift for x in xs], vals, width,
                      label=label, color=colour)
      left.bar_label(bars, fmt="%.0f", fontsize=7)
      pct = [change.get((r["placement"], n), {}).get(key, 0.0)
             for r in group]
      right.bar([x + shift for x in xs], pct, width, label=label,
                color=colour)
    plain = results.get("plain_ms", {}).get(str(n))
    if plain:
      left.axhline(plain, color="black", linestyle=":", linewidth=1,
                   label=f"unpipelined, one device ({plain:.0f} ms)")
    for ax in (left, right):
      ax.set_xticks(list(xs), names)
      ax.grid(True, axis="y", alpha=0.3)
    left.set_ylabel("batch latency (ms)")
    left.set_title(f"N = {n} micro-batches of"
                   f" {group[0]['rows']} sequences, {group[0]['devices']}"
                   " devices")
    left.legend(fontsize=7)
    right.axhline(0, color="black", linewidth=0.8)
    right.set_ylabel("latency change vs vshape (%)")
    right.set_title("negative = lower latency than V-shape")
  model = results.get("model", {})
  fig.suptitle(f"inference: {model.get('name', '?')}")
  path = f"{stem}_inference.png"
  fig.savefig(path, dpi=100)
  return [path]


def plot_file(path: str, output_dir: str | None = None) -> list[str]:
  """Reads a inference result file and draws it next to it (or in
  ``output_dir``).

  Raises:
    ValueError: if the file is not a inference result.
  """
  return runs.plot_file(path, "inference", plot_inference, output_dir)


def main(argv: list[str]) -> None:
  if len(argv) < 2:
    raise app.UsageError("give result files: python -m"
                         " experiments.inference_plot results/inference/"
                         "run_<hash>.json")
  for path in argv[1:]:
    for picture in plot_file(path):
      print(f"wrote {picture}")


if __name__ == "__main__":
  cli.run(main)
