"""The time/memory frontier runner (no flags); see ``experiments.frontier``.

For one model and device count, ``run(args)`` sweeps placements x pipeline
width (devices per pipeline) x data-parallel width x memory limits with
``tessel_jax.search.frontier.sweep`` and writes
``<output_dir>/run_{hash}.json``: the model's per-layer costs, every plan
(step time, peak memory per device, the schedule's figures), the Pareto set
and the plan chosen for ``memory_limit`` (the fastest whose peak fits).

With ``model`` naming a real program (``readme_gpt`` or a model-zoo
model) the plans of that JAX function are priced instead
(``experiments.frontier_program``, ``tj.frontier``).

Costs come from the analytic GPT presets (``frontier.PRESETS``, the
default: instant) or, with ``cost_source="measured"``, from measuring a
small GPT's layers on the real backend with ``tessel_jax``'s cost model
(``experiments.gpt_profile.profile_layers``; cached). Pictures are a
separate step: ``python -m experiments.frontier_plot <run_{hash}.json>``.
"""

from __future__ import annotations

import os
import re
import time
from collections.abc import Callable
from typing import Any, NamedTuple

from experiments import frontier_program
from experiments import runs
from tessel_jax.cost.link import LinkModel, default_link
from tessel_jax.search import frontier

RUNNER = "frontier"
COST_SOURCES = ("analytic", "measured")
GIB = 2**30


class FrontierArgs(NamedTuple):
  """Everything ``frontier_lib.run`` needs; see the flags for meanings."""

  cost_source: str = "analytic"
  model: str = "mt5_like"
  devices: int = 8
  placements: tuple[str, ...] = frontier.DEFAULT_PLACEMENTS
  pipes: tuple[int, ...] | None = None
  microbatches: int = 32
  memory_levels: tuple[float, ...] = (0.5,)
  memory_limits: tuple[int, ...] = ()
  memory_limit: int | None = 16 * GIB
  link_latency_s: float | None = None
  link_bandwidth: float | None = None
  optimizer_slots: int = 2
  shard_shared: bool = False
  baselines: bool = True
  time_limit: float = 2.0
  seed: int = 0
  gpt_vocab: int = 4096
  gpt_d_model: int = 64
  gpt_layers: int = 6
  gpt_heads: int = 4
  gpt_seq: int = 32
  gpt_rows: int = 8
  cache_dir: str | None = None
  output_dir: str = "results/frontier"


_SIZE = re.compile(
    r"^\s*([0-9]*\.?[0-9]+(?:e[-+]?[0-9]+)?)\s*([kmgt]i?b?|b)?\s*$",
    re.IGNORECASE)
_UNITS = {"": 1, "b": 1, "k": 10**3, "kb": 10**3, "kib": 2**10, "ki": 2**10,
          "m": 10**6, "mb": 10**6, "mib": 2**20, "mi": 2**20,
          "g": 10**9, "gb": 10**9, "gib": 2**30, "gi": 2**30,
          "t": 10**12, "tb": 10**12, "tib": 2**40, "ti": 2**40}


def parse_bytes(text: str) -> int | None:
  """``"16GiB"``, ``"512MiB"``, ``"2.5e9"`` -> bytes; ``"none"`` -> None.

  Raises:
    ValueError: naming the text and the accepted forms.
  """
  if text.strip().lower() in ("none", ""):
    return None
  m = _SIZE.match(text)
  if not m or (m.group(2) or "").lower() not in _UNITS:
    raise ValueError(f"memory size {text!r}: give a number of bytes with an"
                     " optional unit (B, KiB, MiB, GiB, TiB, kB, MB, GB), or"
                     " 'none'")
  return int(float(m.group(1)) * _UNITS[(m.group(2) or "").lower()])


def check_args(args: FrontierArgs) -> None:
  """Raises ValueError naming a bad argument and what is allowed."""
  if args.cost_source not in COST_SOURCES:
    raise ValueError(f"cost_source {args.cost_source!r}: choose from"
                     f" {list(COST_SOURCES)}")
  program = args.model in frontier_program.programs()
  if (args.cost_source == "analytic" and args.model not in frontier.PRESETS
      and not program):
    raise ValueError(f"model {args.model!r}: choose an analytic preset from"
                     f" {list(frontier.PRESETS)} or a program from"
                     f" {list(frontier_program.programs())}")
  bad = [p for p in args.placements if p not in frontier.SUPPORTED]
  if bad or not args.placements:
    raise ValueError(f"placements {list(args.placements)}: choose from"
                     f" {list(frontier.SUPPORTED)}")
  if args.devices < 1:
    raise ValueError(f"devices must be >= 1, got {args.devices}")
  if args.pipes is not None and any(
      p < 1 or args.devices % p for p in args.pipes):
    raise ValueError(f"pipes {list(args.pipes)} must divide devices"
                     f" {args.devices}")
  if args.microbatches < 1:
    raise ValueError(f"microbatches must be >= 1, got {args.microbatches}")
  if any(not 0 < f < 1 for f in args.memory_levels):
    raise ValueError(f"memory_levels {list(args.memory_levels)} must lie in"
                     " (0, 1)")
  if any(m <= 0 for m in args.memory_limits) or (
      args.memory_limit is not None and args.memory_limit <= 0):
    raise ValueError("memory limits must be > 0 bytes")
  if args.time_limit <= 0:
    raise ValueError(f"time_limit must be > 0, got {args.time_limit}")
  if args.optimizer_slots < 0:
    raise ValueError(f"optimizer_slots must be >= 0, got"
                     f" {args.optimizer_slots}")


def link_model(args: FrontierArgs) -> LinkModel:
  """The link: the source's default (analytic: an accelerator link;
  measured: this backend's default) with the overrides applied."""
  if args.cost_source == "analytic":
    base = frontier.DEFAULT_LINK
  else:
    import jax  # pylint: disable=import-outside-toplevel
    base = default_link(jax.devices()[0].platform)
  if args.link_latency_s is None and args.link_bandwidth is None:
    return base
  return LinkModel(
      base.latency_s if args.link_latency_s is None else args.link_latency_s,
      (base.bandwidth_bytes_per_s if args.link_bandwidth is None
       else args.link_bandwidth), "user")


def model_costs(args: FrontierArgs) -> frontier.ModelCosts:
  """The per-layer costs: an analytic preset or measured layers."""
  if args.cost_source == "analytic":
    return frontier.gpt_costs(frontier.PRESETS[args.model], args.model)
  from experiments import gpt_profile  # pylint: disable=import-outside-toplevel
  shape = gpt_profile.GPTShape(vocab=args.gpt_vocab, d_model=args.gpt_d_model,
                               layers=args.gpt_layers, heads=args.gpt_heads,
                               seq=args.gpt_seq, rows=args.gpt_rows)
  return gpt_profile.profile_layers(shape, cache_dir=args.cache_dir,
                                    seed=args.seed)


def run(args: FrontierArgs,
        log: Callable[[str], None] = print) -> dict[str, Any]:
  """Sweeps the plans; writes and returns the results.

  Returns:
    ``{"runner", "args", "environment", "output", "model", "link",
    "frontier", "pareto_labels", "chosen_label", "cost_seconds",
    "sweep_seconds", "wall_seconds"}``; ``frontier`` is
    ``Frontier.to_dict()`` (``plans``, ``pareto``, ``chosen``,
    ``memory_limit_bytes``, ``skipped``).

  Raises:
    ValueError: for bad arguments (see ``check_args``).
  """
  check_args(args)
  t0 = time.perf_counter()
  results = runs.new_results(RUNNER, args)
  results["environment"]["load_average"] = list(os.getloadavg())
  if args.model in frontier_program.programs():
    results.update(frontier_program.run(args, log))
    results["wall_seconds"] = round(time.perf_counter() - t0, 3)
    import jax  # pylint: disable=import-outside-toplevel
    results["environment"]["jax"] = jax.__version__
    results["environment"]["backend"] = jax.devices()[0].platform
    runs.write(results)
    return results
  model = model_costs(args)
  cost_s = time.perf_counter() - t0
  link = link_model(args)
  log(f"model {model.name} ({model.source}): {len(model.layers)} layers,"
      f" {fmt_bytes(sum(l.param_bytes for l in model.layers))} of"
      f" parameters; link {link.latency_s * 1e6:.0f} us +"
      f" {link.bandwidth_bytes_per_s / 1e9:.0f} GB/s")
  t1 = time.perf_counter()
  fr = frontier.sweep(
      model, args.devices, placements=args.placements, pipes=args.pipes,
      microbatches=args.microbatches, memory_levels=args.memory_levels,
      memory_limits=args.memory_limits, memory_limit=args.memory_limit,
      link=link, optimizer_slots=args.optimizer_slots,
      shard_shared=args.shard_shared, baselines=args.baselines,
      time_limit_s=args.time_limit, seed=args.seed,
      log=lambda line: log(f"[{time.perf_counter() - t1:7.1f} s] {line}"))
  sweep_s = time.perf_counter() - t1
  results.update({
      "model": model.to_dict(), "link": link.to_dict(),
      "frontier": fr.to_dict(),
      "pareto_labels": [fr.plans[i].label for i in fr.pareto],
      "chosen_label": (fr.plans[fr.chosen].label if fr.chosen is not None
                       else None),
      "cost_seconds": round(cost_s, 3), "sweep_seconds": round(sweep_s, 3),
      "wall_seconds": round(time.perf_counter() - t0, 3)})
  if args.cost_source == "measured":
    import jax  # pylint: disable=import-outside-toplevel
    results["environment"]["jax"] = jax.__version__
    results["environment"]["backend"] = jax.devices()[0].platform
  runs.write(results)
  return results


def plans_of(results: dict[str, Any]) -> list[frontier.PlanResult]:
  """The plans of a result file as ``PlanResult`` objects."""
  return [frontier.PlanResult.from_dict(p)
          for p in results["frontier"]["plans"]]


def fmt_bytes(n: float) -> str:
  """``1.5 GiB``, ``12.3 MiB``, ``800 KiB``."""
  for unit, size in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
    if abs(n) >= size:
      return f"{n / size:.4g} {unit}"
  return f"{n:.0f} B"


def _row(p: frontier.PlanResult, mark: str = "") -> str:
  return (f"| {p.label}{mark} | {p.step_seconds * 1e3:.4g} |"
          f" {fmt_bytes(p.peak_bytes)} | {fmt_bytes(p.fixed_bytes)} |"
          f" {p.bubble_ratio:.3f} | {p.source} |")


def summary(results: dict[str, Any]) -> str:
  """The Pareto set as a markdown table, and the chosen plan."""
  if "program_frontier" in results:
    return frontier_program.summary(results)
  fr = results["frontier"]
  plans = plans_of(results)
  limit = fr["memory_limit_bytes"]
  lines = [f"frontier: {len(plans)} plans ({len(fr['skipped'])} cases"
           f" skipped) in {results['wall_seconds']:.1f} s wall"
           f" ({results['output']})",
           f"Pareto set ({len(fr['pareto'])} plans; * = chosen):", "",
           "| plan | step ms | peak per device | fixed per device | bubbles |"
           " schedule |", "|---|---|---|---|---|---|"]
  for i in fr["pareto"]:
    lines.append(_row(plans[i], " *" if i == fr["chosen"] else ""))
  where = ("no limit" if limit is None
           else f"{fmt_bytes(limit)} per device")
  if fr["chosen"] is None:
    lines.append(f"\nchosen for {where}: nothing fits")
  else:
    c = plans[fr["chosen"]]
    lines.append(f"\nchosen for {where}: {c.label}: step"
                 f" {c.step_seconds * 1e3:.4g} ms, peak"
                 f" {fmt_bytes(c.peak_bytes)}, layer groups"
                 f" {list(c.groups)}")
  return "\n".join(lines)
