"""Copies XLA put in a lowered program, per while body and switch branch.

  python -m experiments.hlo_copies                 # peer_bench's MLP, N=8
  python -m experiments.hlo_copies --model=tp      # tp_bench's pipe2_model2

Compiles the program (8 fake CPU devices, uniform spans) with the default
lowering (``--interpret_ramps=8``) and the compact one (``0``) and prints,
for every while-loop body and conditional branch of the compiled HLO that
holds a ``copy``, the number of copies and the MiB they move each time it
runs (scalars left out), then the totals per kind. A copy in a loop body
runs every iteration (every tick of an interpreted ramp, every period of a
loop); one in a branch runs where the branch is taken.
"""

from __future__ import annotations

import collections
import os
import re
import sys

_INSTR = re.compile(r"= (\w+)\[([0-9,]*)\]\S* copy\(")
_BYTES = {"f64": 8, "s64": 8, "f32": 4, "s32": 4, "u32": 4, "bf16": 2,
          "f16": 2, "s16": 2, "pred": 1, "s8": 1, "u8": 1}


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


def _program(model: str, ramps: int, n: int):
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


def main(argv: list[str]) -> int:
  from absl import flags
  flags.DEFINE_enum("model", "mlp", ["mlp", "tp"], "peer_bench's MLP or"
                    " tp_bench's pipe2_model2.")
  flags.DEFINE_list("interpret_ramps", ["8", "0"], "Lowerings to compile.")
  flags.DEFINE_integer("n", 8, "Micro-batches.")
  flags.FLAGS(argv)
  f = flags.FLAGS
  for ramps in map(int, f.interpret_ramps):
    step, params, batch = _program(f.model, ramps, f.n)
    text = step.lower(params, batch).compile().as_text()
    print(f"{f.model} interpret_ramps={ramps}: "
          f"{step.built.plan.loop_summary()}, {len(text) // 1000} kchars")
    total = collections.Counter()
    for kind, name, n, nbytes in sorted(copies(text)):
      total[kind] += nbytes
      print(f"  {kind:6s} {name[:48]:48s} {n:3d} copies"
            f" {nbytes / 2**20:7.2f} MiB")
    print("  MiB per kind:", {k: round(v / 2**20, 2) for k, v in
                              sorted(total.items())})
  return 0


if __name__ == "__main__":
  os.environ["XLA_FLAGS"] = " ".join(
      x for x in [os.environ.get("XLA_FLAGS", ""),
                  "--xla_force_host_platform_device_count=8"] if x)
  os.environ.setdefault("JAX_PLATFORMS", "cpu")
  sys.exit(main(sys.argv))
