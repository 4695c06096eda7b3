"""The fixed cost of a step's call, beside the zoo's steps (issue 15).

A step of the zoo's smallest model (eqx_mlp, ~2-3 ms) measured 1.5x its
prediction under ``cost="measured"``. If a call paid a fixed cost the
prediction misses (dispatch, argument and output handling per leaf, the
host round trip), it would show there and barely on the big models. This
runner measures that cost directly: programs with no work and ``k`` leaves
in and out (a plain ``jit`` writing zeros, and a ``shard_map`` of one
``ppermute`` per leaf: a collective rendezvous each), and, per zoo model,
its lowered step timed beside a zero-work program with the step's own
leaves in and out, next to the prediction's per-step terms. Wall medians
over shuffled rounds, normal priority.
"""

from __future__ import annotations

import json
import os
import random
import statistics
import time
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec

import tessel_jax as tj
from experiments.model_zoo_models import BUILDERS


class FloorArgs(NamedTuple):
  """What ``main`` runs (``step_floor_args.from_flags``)."""
  models: Sequence[str]
  microbatches: int
  rows: int
  rounds: int
  cost: str
  leaves: Sequence[int]
  output: str | None


def time_shuffled(runs: dict[Any, Callable[[], Any]], rounds: int,
                  seed: int = 0) -> dict[Any, float]:
  """Median wall milliseconds of each run, every run once per round in a
  shuffled order (after one warm call each)."""
  for run in runs.values():
    jax.block_until_ready(run())
  walls: dict[Any, list[float]] = {k: [] for k in runs}
  rng = random.Random(seed)
  for _ in range(rounds):
    order = list(runs)
    rng.shuffle(order)
    for k in order:
      t0 = time.perf_counter()
      jax.block_until_ready(runs[k]())
      walls[k].append(time.perf_counter() - t0)
  return {k: 1e3 * statistics.median(v) for k, v in walls.items()}


def leaf_programs(mesh: Any, leaves: Sequence[int]
                  ) -> dict[tuple[int, str], Callable[[], Any]]:
  """Zero-work programs on ``mesh``: ``(k, kind) -> run`` with ``k``
  replicated 64x64 float32 leaves in and out; kind ``"jit_zeros"`` or
  ``"ppermute_each"`` (a ``shard_map`` permuting every leaf)."""
  rep = NamedSharding(mesh, PartitionSpec())
  axis = mesh.axis_names[0]
  n = mesh.devices.size
  perm = [(i, (i + 1) % n) for i in range(n)]

  def ring(xs: list[Any]) -> list[Any]:
    return [jax.lax.ppermute(x, axis, perm) for x in xs]

  kinds = {
      "jit_zeros": jax.jit(lambda xs: [jnp.zeros_like(x) for x in xs]),
      "ppermute_each": jax.jit(jax.shard_map(
          ring, mesh=mesh, in_specs=(PartitionSpec(),),
          out_specs=PartitionSpec(), check_vma=False)),
  }
  runs = {}
  for k in leaves:
    xs = [jax.device_put(np.ones((64, 64), np.float32), rep)
          for _ in range(k)]
    for kind, fn in kinds.items():
      compiled = fn.lower(xs).compile()
      runs[(k, kind)] = (lambda c, a: lambda: c(a))(compiled, xs)
  return runs


def model_row(name: str, args: FloorArgs, mesh: Any) -> dict[str, Any]:
  """One zoo model: its step and a zero-work program with the step's
  leaves in and out, timed paired, with the prediction's terms."""
  model = BUILDERS[name](args.rows * args.microbatches)
  step = tj.schedule(model.fn, mesh=mesh, placement=tj.placements.vshape(2),
                     num_microbatches=args.microbatches,
                     has_aux=model.has_aux, cut="auto", cost=args.cost)
  built = step.build(model.params, model.batch)
  rep = built.report
  compiled = built.jitted.lower(model.params, model.batch).compile()
  outs = jax.tree_util.tree_map(
      lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=a.sharding),
      compiled(model.params, model.batch))
  zeros = jax.jit(lambda p, b: jax.tree_util.tree_map(
      lambda a: jnp.zeros(a.shape, a.dtype), outs),
      out_shardings=jax.tree_util.tree_map(lambda a: a.sharding, outs))
  floor = zeros.lower(model.params, model.batch).compile()
  ms = time_shuffled(
      {"step": lambda: compiled(model.params, model.batch),
       "floor": lambda: floor(model.params, model.batch)}, args.rounds)
  return {"model": name,
          "leaves_in": len(jax.tree_util.tree_leaves(
              (model.params, model.batch))),
          "leaves_out": len(jax.tree_util.tree_leaves(outs)),
          "predicted_ms": round(rep.predicted_step_ms, 3),
          "step_ms": round(ms["step"], 3),
          "measured_over_predicted": round(
              ms["step"] / rep.predicted_step_ms, 3),
          "floor_ms": round(ms["floor"], 3),
          "floor_share_of_step": round(ms["floor"] / ms["step"], 3),
          "outside_ms": round(rep.outside_ms, 3), "ticks": rep.ticks,
          "tick_overhead_ms": round(rep.tick_overhead_ms, 4),
          "barrier_ms": round(rep.barrier_ms, 3)}


def main(args: FloorArgs, log: Callable[[str], None] = print) -> int:
  """Leaf programs, then every model; writes the JSON."""
  mesh = jax.sharding.Mesh(np.array(jax.devices()[:2]), ("pipe",))
  load = list(os.getloadavg())
  leaf = time_shuffled(leaf_programs(mesh, args.leaves), 2 * args.rounds)
  leaf_rows = [{"leaves_in_out": k, "program": kind, "ms": round(v, 4)}
               for (k, kind), v in sorted(leaf.items())]
  for r in leaf_rows:
    log(json.dumps(r))
  rows = []
  for name in args.models:
    rows.append(model_row(name, args, mesh))
    log(json.dumps(rows[-1]))
  result = {"load_start": load, "load_end": list(os.getloadavg()),
            "cost": args.cost, "leaf_programs": leaf_rows, "models": rows}
  if args.output:
    os.makedirs(os.path.dirname(args.output) or ".", exist_ok=True)
    with open(args.output, "w", encoding="utf-8") as f:
      json.dump(result, f, indent=1)
  return 0
