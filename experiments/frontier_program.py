"""``experiments.frontier --model=readme_gpt|<zoo model>``: the frontier of a
real program (no flags here; see ``frontier_args``).

Where the analytic presets price a GPT from flops and bytes, this prices
the plans of an actual JAX step function with ``tj.frontier``: every named
placement that fits a pipeline width of the 1-D mesh of ``--devices`` fake
CPU devices (``pipe x data`` factorisations included), its classic
baselines, and (with ``--memory_limit``) the searched plan under that
limit. ``--cost_source=measured`` times every kernel on this backend (the
step in ms); ``analytic`` prices uniform spans (the makespan in steps,
instant). The program is the README's GPT (``tj.boundary`` markers; plans
with another block count are cut automatically) or a model-zoo model
(``experiments.model_zoo_models``; cut automatically).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from typing import Any

README_GPT = "readme_gpt"


def zoo_names() -> tuple[str, ...]:
  """Model-zoo builders (their packages are imported only when built)."""
  from experiments import model_zoo_models  # pylint: disable=import-outside-toplevel
  return tuple(model_zoo_models.BUILDERS)


def programs() -> tuple[str, ...]:
  """Every ``--model`` that names a real program."""
  return (README_GPT,) + zoo_names()


def load(name: str, rows: int) -> tuple[Callable[..., Any], Any, Any, bool]:
  """``(fn, params, batch, has_aux)`` of program ``name`` with ``rows``
  batch rows.

  Raises:
    ValueError: an unknown name, or a model whose package is missing.
  """
  if name == README_GPT:
    from experiments import auto_plan_lib  # pylint: disable=import-outside-toplevel
    args = auto_plan_lib.AutoPlanArgs(microbatches=1, microbatch_size=rows)
    fn, params, batch = auto_plan_lib.gpt(args)
    return fn, params, batch, False
  from experiments import model_zoo_models  # pylint: disable=import-outside-toplevel
  if name not in model_zoo_models.BUILDERS:
    raise ValueError(f"model {name!r}: choose {README_GPT!r}, a model-zoo"
                     f" model ({', '.join(model_zoo_models.BUILDERS)}) or an"
                     f" analytic preset")
  try:
    model = model_zoo_models.BUILDERS[name](rows)
  except ImportError as err:
    raise ValueError(f"model {name!r} needs a package that is not installed"
                     f" ({err}); pip install -e '.[models]'") from None
  return model.fn, model.params, model.batch, model.has_aux


def run(args: Any, log: Callable[[str], None] = print) -> dict[str, Any]:
  """Prices every plan of ``args.model`` on ``args.devices`` fake devices.

  Returns:
    The result fields: ``program``, ``program_frontier``
    (``ProgramFrontier.to_dict()``), ``chosen_label``, ``runner_up_label``,
    ``pareto_labels``, ``unit``, ``rows``, ``sweep_seconds``.
  """
  import jax  # pylint: disable=import-outside-toplevel
  import tessel_jax as tj  # pylint: disable=import-outside-toplevel
  if len(jax.devices()) < args.devices:
    raise ValueError(f"--devices={args.devices} but JAX has"
                     f" {len(jax.devices())} devices; run the binary (it"
                     f" sets the fake CPU device count) or set XLA_FLAGS="
                     f"--xla_force_host_platform_device_count={args.devices}")
  rows = args.microbatches * args.gpt_rows
  fn, params, batch, has_aux = load(args.model, rows)
  mesh = jax.make_mesh((args.devices,), ("pipe",),
                       devices=jax.devices()[:args.devices])
  cost = "measured" if args.cost_source == "measured" else "uniform"
  log(f"program {args.model}: {rows} rows, {args.microbatches} micro-batches,"
      f" {args.devices} devices, cost {cost}")
  t0 = time.perf_counter()
  fr = tj.frontier(fn, mesh=mesh, placements=args.placements,
                   microbatches=[args.microbatches],
                   memory_limit=args.memory_limit, baselines=args.baselines,
                   cost=cost, cache_dir=args.cache_dir,
                   solver_time_limit_s=args.time_limit,
                   optimizer_slots=args.optimizer_slots,
                   has_aux=has_aux)(params, batch)
  seconds = time.perf_counter() - t0
  log(str(fr))
  best = fr.choose(args.memory_limit)
  second = fr.runner_up(args.memory_limit)
  return {"program": args.model, "program_frontier": fr.to_dict(),
          "chosen_label": best.label if best is not None else None,
          "runner_up_label": second.label if second is not None else None,
          "pareto_labels": [fr.plans[i].label for i in fr.pareto],
          "unit": fr.plans[0].unit if fr.plans else None, "rows": rows,
          "sweep_seconds": round(seconds, 3)}


def plot(results: dict[str, Any], stem: str) -> list[str]:
  """Draws a program frontier result to ``<stem>_frontier.png``."""
  from tessel_jax import plot as _plot  # pylint: disable=import-outside-toplevel
  fr = results["program_frontier"]
  plans = fr["plans"]
  if not plans:
    raise ValueError(f"{results.get('output', stem)} has no plans to draw")
  limit = results["args"].get("memory_limit")
  fits = [i for i, p in enumerate(plans)
          if limit is None or p["peak_bytes"] <= limit]
  chosen = min(fits, key=lambda i: (plans[i]["step"], plans[i]["peak_bytes"],
                                    i), default=None)
  path = f"{stem}_frontier.png"
  _plot.frontier_scatter(
      [(p["peak_bytes"], p["step"], p["candidate"]["placement"],
        p["candidate"]["plan"] is not None) for p in plans],
      tuple(fr["pareto"]), path, title=f"plans of {results['program']}",
      step_unit=plans[0]["unit"], chosen=chosen, memory_limit=limit)
  return [path]


def summary(results: dict[str, Any]) -> str:
  """Every plan of a program frontier, fastest first, and the choice."""
  fr = results["program_frontier"]
  plans = fr["plans"]
  unit = results.get("unit") or "ms"
  lines = [f"frontier of {results['program']}: {len(plans)} plans"
           f" ({len(fr['skipped'])} skipped) in"
           f" {results['sweep_seconds']:.1f} s ({results['output']})", "",
           f"| plan | step {unit} | peak per device | schedule | Pareto |",
           "|---|---|---|---|---|"]
  for i in sorted(range(len(plans)), key=lambda k: plans[k]["step"]):
    p = plans[i]
    mark = " *" if p["label"] == results["chosen_label"] else ""
    lines.append(f"| {p['label']}{mark} | {p['step']:.4g} |"
                 f" {p['peak_bytes'] / 2**20:.3f} MiB | {p['source']} |"
                 f" {'yes' if i in fr['pareto'] else ''} |")
  limit = results["args"].get("memory_limit")
  where = "no limit" if limit is None else f"{limit / 2**20:.4g} MiB per device"
  lines.append(f"\nchosen for {where}: {results['chosen_label'] or 'nothing fits'}"
               f" (* above); runner-up {results['runner_up_label']}")
  return "\n".join(lines)


def set_device_count(devices: int) -> None:
  """Fake CPU devices for the program (before JAX first uses a device)."""
  flag = f"--xla_force_host_platform_device_count={devices}"
  os.environ["XLA_FLAGS"] = " ".join(
      x for x in (os.environ.get("XLA_FLAGS", ""), flag) if x)
  os.environ.setdefault("JAX_PLATFORMS", "cpu")
