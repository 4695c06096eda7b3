"""Schedule pictures (matplotlib Gantt charts) and Chrome/Perfetto traces.

Everything here draws with matplotlib's object API on an Agg canvas: no
``pyplot``, no window, no global backend switch, so it is safe inside tests,
servers and notebooks alike.

* ``gantt``: one row per device, one colour per micro-batch (cycling a
  colormap), forward/backward/weight blocks told apart by shading (F solid,
  B hatched, W dotted and paler), labels where they fit, repetend boundaries
  as dashed vertical lines.
* ``gantt_compare``: several schedules stacked on one time axis;
  ``compare``: the searched schedule against a classic one, in one call.
* ``chrome_trace``: the trace-event JSON that ``chrome://tracing`` and
  https://ui.perfetto.dev open (one thread per device).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from matplotlib import colormaps
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.collections import PatchCollection
from matplotlib.figure import Figure
from matplotlib.patches import Patch, Rectangle

from tessel_jax.checks import IMAGE_SUFFIXES  # noqa: F401  (re-exported)
from tessel_jax.schedule import UnrolledSchedule

# Shading per block kind: (alpha, hatch).
_KIND_STYLE = {"F": (1.0, ""), "B": (0.75, "////"), "W": (0.45, "..")}
_DPI = 100
_LABEL_FONT = 6.0
_ROW_INCHES = 0.42
_MIN_WIDTH_IN, _MAX_WIDTH_IN = 8.0, 40.0


def microbatch_color(microbatch: int) -> tuple[float, float, float, float]:
  """RGBA colour of a micro-batch: the 20 ``tab20`` colours, dark ones first."""
  cmap = colormaps["tab20"]
  index = (2 * microbatch) % 20 + (microbatch // 10) % 2
  return cmap(index)


def _visible_steps(schedule: UnrolledSchedule, max_steps: int | None) -> int:
  steps = schedule.makespan
  if max_steps is not None:
    if max_steps < 1:
      raise ValueError(f"max_steps is {max_steps}; give a positive step count"
                       " or None to draw the whole schedule")
    steps = min(steps, max_steps)
  return max(steps, 1)


def _figure_width(steps: int) -> float:
  return min(_MAX_WIDTH_IN, max(_MIN_WIDTH_IN, 0.16 * steps + 1.5))


def _repetend_lines(period: int | None, start: int | None, end: int | None,
                    steps: int) -> list[int]:
  """Steps at which repetend iterations begin (and the steady state ends)."""
  if period is None:
    if start is not None or end is not None:
      raise ValueError("repetend_start/repetend_end need repetend_period")
    return []
  if period < 1:
    raise ValueError(f"repetend_period is {period}; it must be >= 1")
  first = 0 if start is None else start
  last = steps if end is None else min(end, steps)
  return [t for t in range(first, last + 1, period) if 0 <= t <= steps]


def _device_runs(devices: tuple[int, ...]) -> list[tuple[int, int]]:
  """Maximal runs of consecutive devices, as (first, last) pairs."""
  runs: list[tuple[int, int]] = []
  for d in sorted(devices):
    if runs and runs[-1][1] == d - 1:
      runs[-1] = (runs[-1][0], d)
    else:
      runs.append((d, d))
  return runs


def _draw(ax, schedule: UnrolledSchedule, steps: int, *,
          lines: list[int], width_in: float, title: str | None) -> None:
  """Draws ``schedule`` up to ``steps`` on the matplotlib axes ``ax``."""
  graph = schedule.graph
  rects: dict[str, list[Rectangle]] = {k: [] for k in _KIND_STYLE}
  colors: dict[str, list[Any]] = {k: [] for k in _KIND_STYLE}
  widths: dict[str, list[float]] = {k: [] for k in _KIND_STYLE}
  px_per_step = width_in * 0.9 * _DPI / steps
  for action in schedule.actions:
    if action.start >= steps:
      continue
    block = graph.block(action.block)
    kind = block.kind if block.kind in _KIND_STYLE else "F"
    shown = min(block.span, steps - action.start)
    shared = len(block.devices) > 1
    for first, last in _device_runs(block.devices):
      rects[kind].append(Rectangle((action.start, first - 0.4), shown,
                                   last - first + 0.8))
      colors[kind].append(microbatch_color(action.microbatch))
      widths[kind].append(1.6 if shared else 0.3)
      _label(ax, block.label, action.microbatch,
             (action.start + shown / 2, (first + last) / 2),
             shown * px_per_step, (last - first + 0.8) * _ROW_INCHES * _DPI)
  for kind, (alpha, hatch) in _KIND_STYLE.items():
    if not rects[kind]:
      continue
    coll = PatchCollection(rects[kind], facecolors=colors[kind],
                           edgecolors="0.1", linewidths=widths[kind],
                           alpha=alpha, hatch=hatch or None)
    ax.add_collection(coll)
  for t in lines:
    ax.axvline(t, color="black", linestyle="--", linewidth=0.9, alpha=0.8)
  ax.set_xlim(0, steps)
  ax.set_ylim(graph.num_devices - 0.5, -0.5)
  ax.set_yticks(range(graph.num_devices))
  ax.set_yticklabels([f"dev{d}" for d in range(graph.num_devices)])
  ax.set_xlabel("time (steps of the search's time unit)")
  if title:
    ax.set_title(title, fontsize=9)
  kinds = sorted({graph.block(a.block).kind for a in schedule.actions},
                 key="FBW".index)
  handles = [Patch(facecolor="0.6", edgecolor="black",
                   alpha=_KIND_STYLE[k][0], hatch=_KIND_STYLE[k][1] or None,
                   label={"F": "forward", "B": "backward",
                          "W": "weight grad"}[k]) for k in kinds]
  if any(len(b.devices) > 1 for b in graph.blocks):
    handles.append(Patch(facecolor="white", edgecolor="black", linewidth=1.6,
                         label="shared by devices"))
  if lines:
    handles.append(Patch(facecolor="none", edgecolor="black",
                         linestyle="--", label="repetend"))
  ax.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.0, 1.0),
            fontsize=7, frameon=False)


def _label(ax: Any, name: str, microbatch: int, at: tuple[float, float],
           width_px: float, height_px: float) -> None:
  """Writes ``name.mb`` in its bar, or ``name`` over ``mb`` when narrow.

  The font shrinks (down to 3 pt) until the text fits the bar.
  """
  char_px = 0.62 * _DPI / 72.0   # per point of font size
  line_px = 1.25 * _DPI / 72.0
  one = f"{name}.{microbatch}"
  size = min(_LABEL_FONT, (width_px - 2) / (len(one) * char_px),
             height_px / line_px)
  text = one
  if size < 5.0:
    two = min(_LABEL_FONT, (width_px - 2) / (max(len(name),
                                                 len(str(microbatch)))
                                             * char_px),
              height_px / (2 * line_px))
    if two > size:
      text, size = f"{name}\n{microbatch}", two
  if size >= 3.0:
    ax.text(at[0], at[1], text, ha="center", va="center", fontsize=size,
            linespacing=1.0, clip_on=True)


def _default_title(schedule: UnrolledSchedule, steps: int) -> str:
  parts = [schedule.graph.name, f"{schedule.source}",
           f"N={schedule.num_microbatches}", f"makespan={schedule.makespan}"]
  if schedule.period is not None:
    parts.append(f"period={schedule.period}")
  if schedule.memory_limit is not None:
    parts.append(f"memory limit {schedule.memory_limit} units")
  parts.append(f"peak memory {max(schedule.peak_memory)} units")
  if steps < schedule.makespan:
    parts.append(f"(first {steps} steps shown)")
  return "  ".join(parts)


def _new_figure(width_in: float, height_in: float) -> Figure:
  fig = Figure(figsize=(width_in, height_in), dpi=_DPI)
  FigureCanvasAgg(fig)
  return fig


def _save(fig: Figure, path: str | None) -> None:
  if path is not None:
    fig.savefig(path, dpi=_DPI, bbox_inches="tight")


def gantt(schedule: UnrolledSchedule, path: str | None = None, *,
          title: str | None = None, max_steps: int | None = None,
          repetend_period: int | None = None,
          repetend_start: int | None = None,
          repetend_end: int | None = None) -> Figure:
  """Draws a Gantt chart of ``schedule``, one row per device.

  Args:
    schedule: The timed schedule.
    path: Where to write the picture (format from the suffix, e.g. ``.png``,
      ``.svg``, ``.pdf``); None: do not write.
    title: Title; default names the placement, N, makespan, period, memory.
    max_steps: Draw only steps ``[0, max_steps)`` (None: the whole schedule).
    repetend_period: Period of the steady state; with it, a dashed line marks
      the start of every repetend iteration.
    repetend_start: Step at which the steady state begins (default 0).
    repetend_end: Step at which the steady state ends (default: the end of
      the drawn range).

  Returns:
    The matplotlib ``Figure`` (Agg canvas; never shown).

  Raises:
    ValueError: for a non-positive ``max_steps`` or ``repetend_period``, or
      a repetend start/end without a period.
  """
  steps = _visible_steps(schedule, max_steps)
  lines = _repetend_lines(repetend_period, repetend_start, repetend_end, steps)
  width = _figure_width(steps)
  height = 1.0 + _ROW_INCHES * schedule.graph.num_devices
  fig = _new_figure(width, height)
  ax = fig.add_subplot(1, 1, 1)
  _draw(ax, schedule, steps, lines=lines, width_in=width,
        title=_default_title(schedule, steps) if title is None else title)
  _save(fig, path)
  return fig


def gantt_compare(schedules: Mapping[str, UnrolledSchedule],
                  path: str | None = None, *, title: str | None = None,
                  max_steps: int | None = None) -> Figure:
  """Stacks the Gantt charts of several schedules on one time axis.

  Args:
    schedules: Label -> schedule (e.g. ``{"tessel": s, "1f1b": b}``); drawn
      top to bottom in the mapping's order.
    path: Where to write the picture; None: do not write.
    title: Overall title (optional).
    max_steps: Draw only steps ``[0, max_steps)`` (None: up to the longest
      makespan), the same range for every schedule.

  Returns:
    The matplotlib ``Figure``.

  Raises:
    ValueError: if ``schedules`` is empty.
  """
  if not schedules:
    raise ValueError("gantt_compare needs at least one schedule")
  longest = max(s.makespan for s in schedules.values())
  steps = max(1, longest if max_steps is None else min(longest, max_steps))
  width = _figure_width(steps)
  rows = [s.graph.num_devices for s in schedules.values()]
  height = sum(0.9 + _ROW_INCHES * r for r in rows) + (0.4 if title else 0.0)
  fig = _new_figure(width, height)
  fig.set_layout_engine("constrained")
  axes = fig.subplots(len(schedules), 1, sharex=True, squeeze=False,
                      gridspec_kw={"height_ratios": [r + 1.5 for r in rows]})
  for ax, (label, schedule) in zip(axes[:, 0], schedules.items()):
    sub = (f"{label}: makespan {schedule.makespan} steps,"
           f" peak memory {max(schedule.peak_memory)} units")
    if schedule.period is not None:
      sub += f"  period={schedule.period}"
    _draw(ax, schedule, steps, lines=[], width_in=width, title=sub)
  for ax in axes[:-1, 0]:
    ax.set_xlabel("")
  if title:
    fig.suptitle(title)
  _save(fig, path)
  return fig


def chrome_trace(schedule: UnrolledSchedule, path: str | None = None,
                 step_us: int = 1000) -> dict[str, Any]:
  """Chrome/Perfetto trace-event JSON of ``schedule``.

  One process, one thread per device, one complete (``"X"``) event per
  (action, device); thread names are ``dev<d>``. Open the file in
  https://ui.perfetto.dev or ``chrome://tracing``.

  Args:
    schedule: The timed schedule.
    path: Where to write the JSON; None: do not write.
    step_us: Microseconds per schedule step (trace timestamps are in us).

  Returns:
    The trace object ``{"traceEvents": [...], "displayTimeUnit": "ms", ...}``.

  Raises:
    ValueError: if ``step_us`` is not positive.
  """
  if step_us <= 0:
    raise ValueError(f"step_us is {step_us}; give a positive number of"
                     " microseconds per step")
  graph = schedule.graph
  events: list[dict[str, Any]] = [
      {"name": "process_name", "ph": "M", "pid": 0, "tid": 0,
       "args": {"name": f"{graph.name} ({schedule.source})"}}]
  for d in range(graph.num_devices):
    events.append({"name": "thread_name", "ph": "M", "pid": 0, "tid": d,
                   "args": {"name": f"dev{d}"}})
    events.append({"name": "thread_sort_index", "ph": "M", "pid": 0,
                   "tid": d, "args": {"sort_index": d}})
  for action in schedule.actions:
    block = graph.block(action.block)
    for d in block.devices:
      events.append({
          "name": f"{block.label} mb{action.microbatch}",
          "cat": block.kind, "ph": "X", "pid": 0, "tid": d,
          "ts": action.start * step_us, "dur": block.span * step_us,
          "args": {"block": block.id, "microbatch": action.microbatch,
                   "kind": block.kind, "start_step": action.start},
      })
  trace = {
      "traceEvents": events,
      "displayTimeUnit": "ms",
      "otherData": {"placement": graph.name, "source": schedule.source,
                    "num_microbatches": schedule.num_microbatches,
                    "makespan_steps": schedule.makespan,
                    "step_us": step_us},
  }
  if path is not None:
    with open(path, "w") as f:
      json.dump(trace, f)
  return trace


def compare(searched: UnrolledSchedule, classic: UnrolledSchedule,
            path: str | None = None, *, labels: tuple[str, str] | None = None,
            max_steps: int | None = None) -> Figure:
  """The searched schedule above a classic one, on one time axis.

  Args:
    searched: The schedule to show first (e.g. ``step.unrolled``).
    classic: The one to compare with (e.g.
      ``baselines.run("1f1b", graph, n)``).
    path: Where to write the picture; None: do not write.
    labels: Names of the two (default: their ``source``).
    max_steps: Draw only the first ``max_steps`` steps.

  Returns:
    The matplotlib ``Figure``; its title reads like
    ``"tessel 83 steps vs zb_h1 89 (7% shorter)"``.

  Raises:
    ValueError: if the two have different placements or micro-batch counts.
  """
  if (searched.graph.num_devices != classic.graph.num_devices
      or searched.num_microbatches != classic.num_microbatches):
    raise ValueError(
        "compare needs two schedules of the same placement and micro-batch"
        f" count; got {searched.graph.name} N={searched.num_microbatches}"
        f" and {classic.graph.name} N={classic.num_microbatches}")
  first, second = labels or (searched.source or "searched",
                             classic.source or "classic")
  if first == second:
    second = f"{second} (2)"
  mine, theirs = searched.makespan, classic.makespan
  change = round(100 * (theirs - mine) / theirs)
  verdict = (f"{change}% shorter" if change > 0 else
             f"{-change}% longer" if change < 0 else "equal")
  title = (f"{searched.graph.name}, N={searched.num_microbatches}: {first}"
           f" {mine} steps vs {second} {theirs} ({verdict})")
  return gantt_compare({first: searched, second: classic}, path,
                       title=title, max_steps=max_steps)


def frontier_scatter(points: list[tuple[int, float, str, bool]],
                     pareto: tuple[int, ...], path: str, *, title: str = "",
                     step_unit: str = "ms", chosen: int | None = None,
                     memory_limit: int | None = None) -> str:
  """Plans as points (peak bytes per device, step), the Pareto set joined as
  a staircase, the memory limit dashed and the chosen plan circled, as
  ``experiments.frontier_plot`` draws a sweep.

  Args:
    points: ``(peak bytes, step, placement, baseline)`` per plan; one colour
      per placement, hollow for a classic baseline schedule.
    pareto: Indices of the Pareto set.
    path: PNG to write.
    title: Figure title.
    step_unit: Unit of the steps (``ms`` or ``steps``).
    chosen: Index of the chosen plan (circled), or None.
    memory_limit: Bytes per device (dashed line), or None.

  Returns:
    ``path``.
  """
  if not points:
    raise ValueError("no plans to draw")
  names = list(dict.fromkeys(p[2] for p in points))
  colours = {n: colormaps["tab10"](i % 10) for i, n in enumerate(names)}
  scale = 2**20
  fig = _new_figure(8, 5.5)
  ax = fig.add_subplot()
  for peak, step, name, base in points:
    ax.scatter(peak / scale, step, s=36, facecolors="none" if base else
               colours[name], edgecolors=colours[name], linewidths=1.2,
               zorder=3)
  xs: list[float] = []
  ys: list[float] = []
  for peak, step, _, _ in sorted((points[i] for i in pareto)):
    if ys:
      xs.append(peak / scale)
      ys.append(ys[-1])
    xs.append(peak / scale)
    ys.append(step)
  ax.plot(xs, ys, color="black", linewidth=1.2, zorder=2,
          label=f"Pareto set ({len(pareto)} plans)")
  if memory_limit is not None:
    ax.axvline(memory_limit / scale, color="grey", linestyle="--",
               label=f"memory limit {memory_limit / scale:.4g} MiB")
  if chosen is not None:
    ax.scatter(points[chosen][0] / scale, points[chosen][1], s=240,
               facecolors="none", edgecolors="red", linewidths=2, zorder=4,
               label="chosen")
  for n in names:
    ax.scatter([], [], color=colours[n], label=n)
  ax.set_xlabel("peak memory per device (MiB)")
  ax.set_ylabel(f"predicted step ({step_unit})")
  ax.set_title(title)
  ax.grid(True, alpha=0.3)
  ax.legend(fontsize=8)
  _save(fig, path)
  return path
