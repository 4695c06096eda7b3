"""Flags of ``python -m experiments.hlo_copies``, read into ``CopiesArgs``.

Importing this module defines the flags; only the binary imports it.
"""

from __future__ import annotations

from absl import app, flags

from experiments.hlo_copies_lib import MODELS, CopiesArgs

flags.DEFINE_enum("model", "mlp", list(MODELS),
                  "peer_bench's MLP (vshape(2)) or tp_bench's pipe2_model2.")
flags.DEFINE_list("interpret_ramps", ["8", "0"],
                  "Lowerings to compile (schedule(interpret_ramps=...)).")
flags.DEFINE_integer("n", 8, "Micro-batches per step.")


def from_flags() -> CopiesArgs:
  """Reads the parsed flags into ``CopiesArgs``.

  Raises:
    app.UsageError: for values that are not integers >= 0 (ramps) or >= 1.
  """
  f = flags.FLAGS
  try:
    ramps = tuple(int(r) for r in f.interpret_ramps)
  except ValueError:
    raise app.UsageError(f"--interpret_ramps must be integers, got"
                         f" {f.interpret_ramps}") from None
  if not ramps or min(ramps) < 0:
    raise app.UsageError(f"--interpret_ramps must be >= 0, got"
                         f" {f.interpret_ramps}")
  if f.n < 1:
    raise app.UsageError(f"--n must be >= 1, got {f.n}")
  return CopiesArgs(model=f.model, interpret_ramps=ramps, microbatches=f.n)
