"""Library of ``python -m experiments.hlo_copies``: the copies XLA put in a
compiled program, per while-loop body and conditional branch.

A copy in a loop body runs every iteration (every tick of an interpreted
ramp, every period of a loop); one in a branch runs where the branch is
taken. :func:`copies` reads them from ``compiled.as_text()``.
"""

from __future__ import annotations

import collections
import dataclasses
import re
from collections.abc import Callable
from typing import Any

MODELS = ("mlp", "tp")

_INSTR = re.compile(r"= (\w+)\[([0-9,]*)\]\S* copy\(")
_BYTES = {"f64": 8, "s64": 8, "f32": 4, "s32": 4, "u32": 4, "bf16": 2,
          "f16": 2, "s16": 2, "pred": 1, "s8": 1, "u8": 1}


@dataclasses.dataclass(frozen=True)
class CopiesArgs:
  """What to compile.

  Attributes:
    model: ``"mlp"`` (peer_bench's MLP on vshape(2)) or ``"tp"`` (tp_bench's
      pipe2_model2).
    interpret_ramps: The lowerings to compile (``schedule(interpret_ramps=)``).
    microbatches: Micro-batches per step.
  """

  model: str = "mlp"
  interpret_ramps: tuple[int, ...] = (8, 0)
  microbatches: int = 8


def copies(text: str) -> list[tuple[str, str, int, int]]:
  """``(kind, computation, copies, bytes)`` for each while body
  (``"while"``) and conditional branch (``"branch"``) holding non-scalar
  copies."""
  from experiments import hlo_count
  comps, _ = hlo_count.computations(text)
  kinds = {}
  for lines in comps.values():
    for line in lines:
      for m in re.finditer(r"body=%?([^,\s}]+)", line):
        kinds[m.group(1)] = "while"
      b = re.search(r"branch_computations=\{([^}]*)\}", line)
      if b:
        for c in b.group(1).split(","):
          kinds[c.strip().lstrip("%")] = "branch"
  out = []
  for name, lines in comps.items():
    if name not in kinds:
      continue
    n = nbytes = 0
    for line in lines:
      m = _INSTR.search(line)
      if m and m.group(2):
        n += 1
        size = 1
        for d in m.group(2).split(","):
          size *= int(d)
        nbytes += size * _BYTES.get(m.group(1), 4)
    if n:
      out.append((kinds[name], name, n, nbytes))
  return out


def _program(model: str, ramps: int, n: int) -> tuple[Any, Any, Any]:
  """``(step, params, batch)`` of ``model`` lowered with ``ramps``."""
  import jax
  import tessel_jax as tj
  from experiments import lowering_bench_lib as lb
  from experiments import peer_gpipe as pg
  from experiments import tp_bench_lib as tb
  from tessel_jax import placements
  if model == "mlp":
    fn, _ = lb.chain_model(2, 1024, 2, 0)
    params = pg.mlp_params(4, 1024, 0)
    batch = lb.make_batch(n * 256, 1024, 1)
    mesh = jax.make_mesh((2,), ("pipe",), devices=jax.devices()[:2],
                         axis_types=(jax.sharding.AxisType.Auto,))
    step = tj.schedule(fn, mesh=mesh, placement=placements.vshape(2),
                       num_microbatches=n, cut="markers", cost="uniform",
                       interpret_ramps=ramps)
    return step, params, batch
  args = tb.BenchArgs(cost="uniform", interpret_ramps=ramps, microbatches=n)
  params, specs, make_fn = tb.gpt(args)
  step, placed, batch, _ = tb._program("pipe2_model2", args, params, specs,
                                       make_fn, tb.make_batch(args))
  return step, placed, batch



def main(args: CopiesArgs, log: Callable[[str], None] = print) -> int:
  """Compiles each lowering and logs its copies; returns the exit code."""
  for ramps in args.interpret_ramps:
    step, params, batch = _program(args.model, ramps, args.microbatches)
    text = step.lower(params, batch).compile().as_text()
    log(f"{args.model} interpret_ramps={ramps}: "
        f"{step.built.plan.loop_summary()}, {len(text) // 1000} kchars")
    total: collections.Counter = collections.Counter()
    for kind, name, n, nbytes in sorted(copies(text)):
      total[kind] += nbytes
      log(f"  {kind:6s} {name[:48]:48s} {n:3d} copies"
          f" {nbytes / 2**20:7.2f} MiB")
    log("  MiB per kind: " + str({k: round(v / 2**20, 2) for k, v in
                                  sorted(total.items())}))
  return 0
