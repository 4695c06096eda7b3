"""Flags of ``python -m experiments.autocut_bench``, read into ``BenchArgs``.

Importing this module defines the flags; only the binary imports it. It imports
no jax (``from_flags`` imports ``autocut_bench_lib`` once the flags are
checked), so ``--help`` stays cheap.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from absl import app, flags

from experiments import cli

if TYPE_CHECKING:
  from experiments.autocut_bench_lib import BenchArgs

flags.DEFINE_list("models", ["plain", "flax", "equinox"],
                  "Models: plain (plain JAX), flax (nnx), equinox; those"
                  " whose library is missing are skipped.")
flags.DEFINE_list("blocks", ["4", "8"], "Forward block counts K.")
flags.DEFINE_integer("layers", 6, "Transformer layers.")
flags.DEFINE_integer("d_model", 128, "Model width.")
flags.DEFINE_integer("heads", 4, "Attention heads.")
flags.DEFINE_integer("vocab", 512, "Vocabulary (tied embedding and head).")
flags.DEFINE_integer("seq", 64, "Sequence length.")
flags.DEFINE_integer("rows", 8, "Rows per micro-batch.")
flags.DEFINE_integer("groups", 24, "Distinct equation groups timed for the"
                     " ground truth (identical layers share groups).")
flags.DEFINE_enum("cost", "measured", ["measured", "analytic"],
                  "Cost model of the cut.")
flags.DEFINE_integer("repeats", 20, "Timed rounds per block (fastest kept).")
flags.DEFINE_bool("single_thread", True,
                  "Run XLA on one CPU thread (steadier timings on a shared"
                  " machine).")
flags.DEFINE_bool("gpt12", True, "Also time the cut of a 12-layer small GPT.")
flags.DEFINE_string("output", "out/autocut_bench.json",
                    "Where to write the JSON results ('': stdout only).")


def from_flags() -> BenchArgs:
  """Reads the parsed flags into ``BenchArgs``.

  Raises:
    app.UsageError: for unknown models or out-of-range numbers.
  """
  f = flags.FLAGS
  cli.check_created(f.output, "--output", suffixes=(".json",))
  models = tuple(m.strip() for m in f.models if m.strip())
  from experiments.autocut_bench_lib import MODELS, BenchArgs  # pylint: disable=import-outside-toplevel
  bad = [m for m in models if m not in MODELS]
  if bad or not models:
    raise app.UsageError(f"--models: unknown {bad}; choose from {MODELS}")
  try:
    blocks = tuple(int(b) for b in f.blocks)
  except ValueError:
    raise app.UsageError(f"--blocks must be integers, got {f.blocks}") from None
  if not blocks or min(blocks) < 1:
    raise app.UsageError(f"--blocks must be >= 1, got {f.blocks}")
  for name in ("layers", "d_model", "heads", "vocab", "seq", "rows", "groups",
               "repeats"):
    if getattr(f, name) < 1:
      raise app.UsageError(f"--{name} must be >= 1, got {getattr(f, name)}")
  if f.d_model % f.heads:
    raise app.UsageError(f"--d_model={f.d_model} must be a multiple of"
                         f" --heads={f.heads}")
  return BenchArgs(models=models, blocks=blocks, layers=f.layers,
                   d_model=f.d_model, heads=f.heads, vocab=f.vocab, seq=f.seq,
                   rows=f.rows, groups=f.groups, cost=f.cost,
                   repeats=f.repeats, single_thread=f.single_thread,
                   gpt12=f.gpt12, output=f.output or None)
