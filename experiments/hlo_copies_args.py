"""Flags of ``python -m experiments.hlo_copies``, read into ``CopiesArgs``.

Importing this module defines the flags; only the binary imports it. It imports
no jax (``from_flags`` imports ``hlo_copies_lib`` once the flags are checked),
so ``--help`` stays cheap.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from absl import app, flags

if TYPE_CHECKING:
  from experiments.hlo_copies_lib import CopiesArgs


flags.DEFINE_enum("model", "mlp", ["mlp", "tp"],
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
  from experiments.hlo_copies_lib import CopiesArgs  # pylint: disable=import-outside-toplevel
  return CopiesArgs(model=f.model, interpret_ramps=ramps, microbatches=f.n)
