"""Pictures of the evaluation runners' result files (no flags here).

``plot_file(path)`` reads one ``run_{hash}.json`` and writes PNGs next to it
(or into ``output_dir``), named ``run_{hash}_<what>.png``; which pictures
depends on the file's ``runner``:

* ``search_scaling``: ``devices`` (search time and proven gap against the
  device count, log scale, one colour per placement, solid = wrap-around
  allowed, dashed = forbidden, a cross where the period is not proven
  optimal), ``memory`` (search time per placement and memory case),
  ``microbatches`` (unroll time and makespan / lower bound against N) and
  ``time_limit`` (proven gap against the CP-SAT budget), each when its part
  ran.
* ``compare_schedules``: ``gantt_<placement>`` (the schedules of one
  placement stacked on one time axis), ``makespan`` (simulated makespan per
  schedule and placement) and ``step_time`` (measured step time of the
  lowered programs, when they ran).

Matplotlib's object API on an Agg canvas, as in ``tessel_jax.plot``.
"""

from __future__ import annotations

import dataclasses
import math
import os
from collections.abc import Callable
from typing import Any, NamedTuple

from matplotlib import colormaps
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.lines import Line2D

from experiments import runs
from tessel_jax import plot
from tessel_jax.graph import BlockGraph
from tessel_jax.schedule import UnrolledSchedule

_DPI = 100


class PlotArgs(NamedTuple):
  """The result files to draw and where to put the pictures."""

  inputs: tuple[str, ...] = ()
  output_dir: str | None = None


def _figure(width: float, height: float) -> Figure:
  fig = Figure(figsize=(width, height), dpi=_DPI)
  FigureCanvasAgg(fig)
  fig.set_layout_engine("constrained")
  return fig


def _save(fig: Figure, path: str) -> str:
  fig.savefig(path, dpi=_DPI)
  return path


def _colors(names: list[str]) -> dict[str, Any]:
  """Distinct colours: ``tab10``, then the paler half of ``tab20``."""
  if len(names) <= 10:
    return {n: colormaps["tab10"](i) for i, n in enumerate(names)}
  cmap = colormaps["tab20"]
  return {n: cmap((2 * i) % 20 + (i // 10) % 2) for i, n in enumerate(names)}


def _log_ticks(ax, values, base: float = 10) -> None:
  """Log x axis with ticks at exactly ``values``, labelled plainly."""
  values = sorted(set(values))
  ax.set_xscale("log", base=base)
  ax.set_xticks(values, [f"{v:g}" for v in values])
  ax.minorticks_off()


def _ordered(values) -> list:
  seen: dict = {}
  for v in values:
    seen.setdefault(v, None)
  return list(seen)


# --- search_scaling -----------------------------------------------------------


def _wrap_style(wrap: bool) -> str:
  return "-" if wrap else "--"


def _placement_legend(ax, colors: dict[str, Any], wraps: list[bool]) -> None:
  handles = [Line2D([], [], color=c, label=n) for n, c in colors.items()]
  for w in wraps:
    handles.append(Line2D([], [], color="0.3", linestyle=_wrap_style(w),
                          label="wrap-around" if w else "no wrap"))
  handles.append(Line2D([], [], color="0.3", marker="x", linestyle="",
                        label="period not proven optimal"))
  ax.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.0, 1.0),
            fontsize=7, frameon=False)


def _series(rows: list[dict[str, Any]], x: str, y: Callable[[dict], float],
            ax, colors: dict[str, Any], label_extra: str = "") -> None:
  """One line per (placement, wrap) of ``rows`` that have no error."""
  for name in colors:
    for wrap in (True, False):
      pts = sorted((r[x], y(r), r.get("status") == "OPTIMAL") for r in rows
                   if r["placement"] == name and r["allow_wrap"] == wrap
                   and "error" not in r)
      if not pts:
        continue
      xs = [p[0] for p in pts]
      ys = [p[1] for p in pts]
      ax.plot(xs, ys, color=colors[name], linestyle=_wrap_style(wrap),
              linewidth=1.2, marker="o", markersize=3)
      for px, py, optimal in pts:
        if not optimal:
          ax.plot([px], [py], color=colors[name], marker="x", markersize=8,
                  linestyle="")


def _gap_axis(ax, rows: list[dict[str, Any]]) -> None:
  """A gap axis from 0 % that stays readable when every gap is 0."""
  gaps = [100 * r["gap"] for r in rows if "error" not in r]
  ax.set_ylim(-2, max([10.0] + gaps) * 1.08)
  ax.set_ylabel("proven gap (P - P_lb) / P  (%)")


def _positive(value: float) -> float:
  return max(value, 1e-3)  # log axes: sub-millisecond searches at 1 ms


def plot_search_scaling(results: dict[str, Any], stem: str) -> list[str]:
  """The pictures of a ``search_scaling`` result; returns the paths.

  One figure per part the run measured (devices, memory, micro-batches,
  CP-SAT budget); a part with no rows draws nothing.
  """
  cases = results["cases"]
  names = _ordered(c["placement"] for c in cases)
  style = _ScalingStyle(names=names, colors=_colors(names),
                        wraps=_ordered(c["allow_wrap"] for c in cases))
  parts = (("devices", _scaling_devices, lambda c: True),
           ("memory", _scaling_memory, lambda c: True),
           ("microbatches", _scaling_microbatches, lambda c: "error" not in c),
           ("time_limit", _scaling_time_limit, lambda c: True))
  written = []
  for part, draw, keep in parts:
    rows = [c for c in cases if c["part"] == part and keep(c)]
    if rows:
      fig = draw(results, rows, style)
      written.append(_save(fig, f"{stem}_{part}.png"))
  return written


@dataclasses.dataclass(frozen=True)
class _ScalingStyle:
  """What every ``search_scaling`` figure shares.

  Attributes:
    names: placements in first-seen order (the x axis of bar charts).
    colors: placement -> colour.
    wraps: the ``allow_wrap`` values present, in first-seen order.
  """
  names: list[str]
  colors: dict[str, Any]
  wraps: list[bool]


def _scaling_devices(results: dict[str, Any], rows: list[dict[str, Any]],
                     style: _ScalingStyle) -> Any:
  """Time to the period, whole search time and gap against the device count."""
  colors = style.colors
  fig = _figure(15, 4.2)
  ax_p, ax_t, ax_g = fig.subplots(1, 3)
  _series(rows, "devices", lambda r: _positive(r["period_seconds"]), ax_p,
          colors)
  _series(rows, "devices", lambda r: _positive(r["search_seconds"]), ax_t,
          colors)
  _series(rows, "devices", lambda r: 100 * r["gap"], ax_g, colors)
  for ax in (ax_p, ax_t, ax_g):
    _log_ticks(ax, [r["devices"] for r in rows], base=2)
    ax.set_xlabel("devices")
    ax.grid(True, which="both", alpha=0.3)
  limit = results["args"]["time_limit"]
  for ax, what in ((ax_p, "time to the period (found and proven)"),
                   (ax_t, "whole search (period + latency"
                    + (" + warmup/cooldown" if results["args"]["complete"]
                       else "") + ")")):
    ax.set_yscale("log")
    ax.set_ylabel("seconds")
    ax.set_title(f"{what}", fontsize=9)
  _gap_axis(ax_g, rows)
  ax_g.set_title("Period quality", fontsize=9)
  fig.suptitle(f"Repetend search against the device count (no memory"
               f" limit, CP-SAT budget {limit:g} s)", fontsize=10)
  _placement_legend(ax_g, colors, style.wraps)
  return fig


def _scaling_memory(results: dict[str, Any], rows: list[dict[str, Any]],
                    style: _ScalingStyle) -> Any:
  """Search time and proven gap per memory case, one pair of axes per mesh."""
  names = style.names
  devices = sorted({r["devices"] for r in rows})
  memories = _ordered(r["memory_case"] for r in rows)
  fig = _figure(max(8, 1.0 * len(names) + 3), 5.0 * len(devices))
  axes = fig.subplots(2 * len(devices), 1, squeeze=False)[:, 0]
  groups = [(m, w) for m in memories for w in style.wraps]
  mem_colors = _colors(memories)
  width = 0.8 / len(groups)
  for k, d in enumerate(devices):
    ax_t, ax_g = axes[2 * k], axes[2 * k + 1]
    for g, (memory, wrap) in enumerate(groups):
      for i, name in enumerate(names):
        row = next((r for r in rows if r["devices"] == d
                    and r["placement"] == name and r["memory_case"] == memory
                    and r["allow_wrap"] == wrap), None)
        if row is None:
          continue
        x = i - 0.4 + (g + 0.5) * width
        if "error" in row:
          ax_t.plot([x], [1e-3], marker="x", color="red", linestyle="")
          ax_g.plot([x], [0], marker="x", color="red", linestyle="")
          continue
        bar = dict(color=mem_colors[memory], hatch="" if wrap else "///",
                   edgecolor="0.2", linewidth=0.3)
        ax_t.bar(x, _positive(row["search_seconds"]), width, **bar)
        ax_g.bar(x, 100 * row["gap"], width, **bar)
    ax_t.set_yscale("log")
    ax_t.set_ylabel("search time (s)")
    ax_t.set_title(f"{d} devices: search time per memory case (CP-SAT"
                   f" budget {results['args']['time_limit']:g} s)",
                   fontsize=9)
    _gap_axis(ax_g, [r for r in rows if r["devices"] == d])
    ax_g.set_title(f"{d} devices: proven gap of the period", fontsize=9)
    for ax in (ax_t, ax_g):
      ax.set_xticks(range(len(names)), names, rotation=30, ha="right",
                    fontsize=8)
      ax.grid(True, axis="y", alpha=0.3)
  handles = [Line2D([], [], color=mem_colors[m], linewidth=6, label=m)
             for m in memories]
  handles.append(Line2D([], [], color="red", marker="x", linestyle="",
                        label="no schedule found in time"))
  axes[0].legend(handles=handles, title="hatched: no wrap", fontsize=7,
                 title_fontsize=7, loc="upper left",
                 bbox_to_anchor=(1.0, 1.0), frameon=False)
  return fig


def _scaling_microbatches(results: dict[str, Any], rows: list[dict[str, Any]],
                          style: _ScalingStyle) -> Any:
  """Unroll time and makespan quality against the micro-batch count."""
  del results  # the rows carry what this figure needs
  colors = style.colors
  fig = _figure(11, 4.2)
  ax_u, ax_r = fig.subplots(1, 2)
  flat = [{**u, "placement": r["placement"], "allow_wrap": r["allow_wrap"],
           "status": "OPTIMAL"} for r in rows for u in r["unroll"]]
  _series(flat, "num_microbatches",
          lambda u: _positive(u["unroll_seconds"]), ax_u, colors)
  _series(flat, "num_microbatches", lambda u: u["makespan_ratio"], ax_r,
          colors)
  for ax in (ax_u, ax_r):
    _log_ticks(ax, [u["num_microbatches"] for u in flat], base=2)
    ax.set_xlabel("micro-batches N")
    ax.grid(True, which="both", alpha=0.3)
  ax_u.set_yscale("log")
  ax_u.set_ylabel("unroll time (s)")
  devices = sorted({r["devices"] for r in rows})
  ax_u.set_title(f"Unroll time, with the CP-SAT completion of small N"
                 f" ({', '.join(map(str, devices))} devices)", fontsize=9)
  ax_r.set_ylabel("makespan / lower bound")
  ax_r.set_title("Makespan quality", fontsize=9)
  _placement_legend(ax_r, colors, style.wraps)
  return fig


def _scaling_time_limit(results: dict[str, Any], rows: list[dict[str, Any]],
                        style: _ScalingStyle) -> Any:
  """Best period and proven gap against the CP-SAT budget."""
  colors = style.colors
  fig = _figure(11, 4.2)
  ax_p, ax_g = fig.subplots(1, 2)
  _series(rows, "time_limit",
          lambda r: r["period"] / max(1, r["period_lower_bound"]), ax_p,
          colors)
  _series(rows, "time_limit", lambda r: 100 * r["gap"], ax_g, colors)
  for ax in (ax_p, ax_g):
    _log_ticks(ax, [r["time_limit"] for r in rows])
    ax.set_xlabel("CP-SAT budget (s)")
    ax.grid(True, which="both", alpha=0.3)
  memory = results["args"]["time_limit_memory"]
  devices = sorted({r["devices"] for r in rows})
  ax_p.set_ylabel("best period / proven lower bound")
  ax_p.set_title(f"Best so far ({memory} memory,"
                 f" {', '.join(map(str, devices))} devices)", fontsize=9)
  _gap_axis(ax_g, rows)
  ax_g.set_title("Proven gap", fontsize=9)
  _placement_legend(ax_g, colors, style.wraps)
  return fig


# --- compare_schedules --------------------------------------------------------


def _label(label: str, entry: dict[str, Any]) -> str:
  """A searched schedule under a memory case shows its limit."""
  if "@" in label and entry.get("memory_limit") is not None:
    return f"{label} (limit {entry['memory_limit']})"
  return label


def _schedules(row: dict[str, Any]) -> dict[str, UnrolledSchedule]:
  graph = BlockGraph.from_dict(row["graph"])
  return {_label(label, e): UnrolledSchedule.from_dict(e["schedule"], graph)
          for label, e in row["schedules"].items() if "schedule" in e}


def _bar_grid(rows: list[dict[str, Any]],
              value: Callable[[dict[str, Any]], dict[str, tuple]],
              ylabel: str, title: str, path: str) -> str | None:
  """One bar chart per placement: ``value(row)`` = label -> (y, text, err)."""
  panels = [(r, value(r)) for r in rows]
  panels = [(r, v) for r, v in panels if v]
  if not panels:
    return None
  labels = _ordered(k for _, v in panels for k in v)
  colors = _colors(labels)
  cols = min(4, len(panels))
  nrows = math.ceil(len(panels) / cols)
  fig = _figure(3.4 * cols, 2.8 * nrows + 0.5)
  axes = fig.subplots(nrows, cols, squeeze=False)
  for ax, (row, bars) in zip(axes.flat, panels):
    names = list(bars)
    for i, name in enumerate(names):
      y, text, err = bars[name]
      ax.bar(i, y, 0.7, color=colors[name], edgecolor="0.2", linewidth=0.3,
             yerr=err, capsize=2 if err else 0)
      ax.text(i, y + (err[1][0] if err else 0), text, ha="center",
              va="bottom", fontsize=6)
    ax.set_xticks(range(len(names)), names, rotation=30, ha="right",
                  fontsize=7)
    ax.set_title(f"{row['placement']} (d={row['devices']},"
                 f" N={row['num_microbatches']})", fontsize=8)
    ax.set_ylabel(ylabel, fontsize=7)
    ax.margins(y=0.15)
  for ax in list(axes.flat)[len(panels):]:
    ax.set_visible(False)
  fig.suptitle(title, fontsize=10)
  return _save(fig, path)


def plot_compare_schedules(results: dict[str, Any], stem: str) -> list[str]:
  """The pictures of a ``compare_schedules`` result; returns the paths."""
  rows = [r for r in results["placements"] if "error" not in r]
  written = []
  for row in rows:
    schedules = _schedules(row)
    if schedules:
      path = f"{stem}_gantt_{row['placement']}.png"
      plot.gantt_compare(schedules, path, title=(
          f"{row['placement']}: {row['devices']} devices,"
          f" N={row['num_microbatches']}"))
      written.append(path)

  def makespans(row: dict[str, Any]) -> dict[str, tuple]:
    out = {}
    for label, e in row["schedules"].items():
      if "error" not in e:
        text = f"{e['makespan']}\npeak {e['max_peak_memory']}"
        if "@" in label and e.get("memory_limit") is not None:
          text += f"\n(limit {e['memory_limit']})"
        out[label] = (e["makespan"], text, None)
    return out

  def step_times(row: dict[str, Any]) -> dict[str, tuple]:
    out = {}
    for label, e in row.get("lowered", {}).items():
      if "error" in e:
        continue
      ms = [1e3 * t for t in e["step_seconds_all"]]
      mid = 1e3 * e["step_seconds"]
      out[label] = (mid, f"{mid:.1f}",
                    [[mid - min(ms)], [max(ms) - mid]])
    return out

  path = _bar_grid(rows, makespans, "makespan (steps)",
                   "Simulated makespan (label: makespan and peak memory)",
                   f"{stem}_makespan.png")
  if path:
    written.append(path)
  path = _bar_grid(rows, step_times, "step time (ms)",
                   "Lowered program on the CPU mesh: median step time"
                   " (bars: min..max)", f"{stem}_step_time.png")
  if path:
    written.append(path)
  return written


# --- entry points -------------------------------------------------------------

PLOTTERS: dict[str, Callable[[dict[str, Any], str], list[str]]] = {
    "search_scaling": plot_search_scaling,
    "compare_schedules": plot_compare_schedules,
}


def plot_results(results: dict[str, Any], stem: str) -> list[str]:
  """Writes the pictures of ``results`` as ``<stem>_<what>.png``.

  Raises:
    ValueError: for a runner that has no pictures here.
  """
  runner = results.get("runner")
  if runner not in PLOTTERS:
    raise ValueError(f"no pictures for runner {runner!r}; known:"
                     f" {', '.join(PLOTTERS)}")
  return PLOTTERS[runner](results, stem)


def plot_file(path: str, output_dir: str | None = None) -> list[str]:
  """Reads one result file and writes its pictures; returns their paths.

  Args:
    path: A ``run_{hash}.json`` written by an evaluation runner.
    output_dir: Folder of the pictures (default: the file's folder).
  """
  results = runs.read(path)
  folder = output_dir or os.path.dirname(path) or "."
  os.makedirs(folder, exist_ok=True)
  stem = os.path.join(folder, os.path.splitext(os.path.basename(path))[0])
  return plot_results(results, stem)


def run(args: PlotArgs) -> list[str]:
  """Draws every input file; returns the paths of the pictures."""
  written = []
  for path in args.inputs:
    written += plot_file(path, args.output_dir)
  return written
