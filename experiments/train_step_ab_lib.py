"""The placed ResNet18 ``train_step`` timed by variant (no flags here).

``python -m experiments.train_step_ab`` reads its flags into
:class:`TrainStepAbArgs` and calls :func:`main`.
"""

from __future__ import annotations

import json
import os
import random
from typing import Any, Callable, NamedTuple

from experiments import resnet_variants

N = 8  # micro-batches, as experiments.resnet_ab's default


class TrainStepAbArgs(NamedTuple):
  variants: tuple[str, ...] = ("base", "workspace")
  rounds: int = 7
  output: str | None = "out/train_step_ab.json"


def _med(xs: list[float]) -> float:
  return sorted(xs)[len(xs) // 2]


def trainer(name: str, fn: Callable, params: Any, batch: Any, opt: Any
            ) -> Callable[[], Any]:
  """A closure taking one ``train_step`` of variant ``name`` (its state
  kept between calls); returns the step's loss."""
  _, step, _ = resnet_variants.build(name, fn, params, batch, N)
  state = {"p": step.place(params, batch)}
  state["o"] = opt.init(state["p"])
  train = step.train_step(opt)

  def run() -> Any:
    value, state["p"], state["o"] = train(state["p"], state["o"], batch)
    return value
  return run


def _checked(runs: dict[str, Callable[[], Any]], ref: str) -> None:
  """Two steps of every variant give the reference variant's losses."""
  losses = {v: [float(run()) for _ in range(2)] for v, run in runs.items()}
  for v, ls in losses.items():
    for a, b in zip(ls, losses[ref]):
      if abs(a - b) > 1e-5 * abs(b):
        raise AssertionError(f"{v}: loss {a} != {ref}'s {b}")


def _row(ts: list[tuple], ref: list[tuple]) -> dict[str, Any]:
  """Medians of one variant's ``placed_bench._timed`` samples and its
  paired ratios against ``ref``'s."""
  pairs = list(zip(ts, ref))
  return {"wall_ms": round(1e3 * _med([t[0] for t in ts]), 1),
          "cpu_ms": round(1e3 * _med([t[1] for t in ts]), 1),
          "sys_ms": round(1e3 * _med([t[2] for t in ts]), 1),
          "faults": _med([t[3] for t in ts]),
          "paired_wall": round(_med([a[0] / b[0] for a, b in pairs]), 3),
          "paired_cpu": round(_med([a[1] / b[1] for a, b in pairs]), 3)}


def main(args: TrainStepAbArgs) -> int:
  """Times every variant once per round, shuffled; prints and writes
  the rows."""
  import optax  # pylint: disable=import-outside-toplevel
  from experiments import placed_bench as pb  # pylint: disable=import-outside-toplevel
  fn, params, batch = pb.model("resnet18_auto", N)
  opt = optax.sgd(1e-3)
  runs = {v: trainer(v, fn, params, batch, opt) for v in args.variants}
  ref = args.variants[0]
  _checked(runs, ref)
  times: dict[str, list] = {v: [] for v in runs}
  loads = []
  for _ in range(args.rounds):
    for v in random.sample(list(runs), len(runs)):
      times[v].append(pb._timed(runs[v]))  # pylint: disable=protected-access
    loads.append(os.getloadavg()[0])
  rows = {v: _row(ts, times[ref]) for v, ts in times.items()}
  for v, row in rows.items():
    print(json.dumps({v: row}), flush=True)
  out = {"n": N, "rounds": args.rounds, "variants": rows,
         "load_average": [round(min(loads), 1), round(max(loads), 1)]}
  print(f"load {out['load_average']}", flush=True)
  if args.output:
    os.makedirs(os.path.dirname(args.output) or ".", exist_ok=True)
    with open(args.output, "w") as fh:
      json.dump(out, fh, indent=1)
  return 0
