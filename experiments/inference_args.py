"""Flags of ``python -m experiments.inference``, read into ``InferenceArgs``.

Importing this module defines the flags; only the binary imports it. It
does not import jax (the binary sets the fake device count first).
"""

from __future__ import annotations

from absl import app, flags

from experiments import cli

_D_PLACEMENTS = "vshape,mshape,mllm,kshape,xshape,interleaved"

flags.DEFINE_list("placements", _D_PLACEMENTS.split(","),
                  "Placements to compare (must include vshape, the"
                  " reference).")
flags.DEFINE_integer("devices", 4, "Devices on the pipe axis (fake CPU"
                     " devices).")
flags.DEFINE_list("microbatches", ["8"], "Micro-batches per batch N (one"
                  " case per value).")
flags.DEFINE_integer("vocab", 8192, "GPT vocabulary (embedding and head"
                     " size).")
flags.DEFINE_integer("d_model", 128, "GPT width.")
flags.DEFINE_integer("layers", 6, "GPT transformer layers.")
flags.DEFINE_integer("heads", 4, "GPT attention heads.")
flags.DEFINE_integer("seq", 64, "Sequence length.")
flags.DEFINE_integer("rows", 8, "Sequences per micro-batch (divisible by 2"
                     " and by --devices).")
flags.DEFINE_bool("measure", True, "Compile and time the lowered programs"
                  " (otherwise predictions only).")
flags.DEFINE_integer("repeats", 7, "Timed runs per program (median kept).")
flags.DEFINE_float("time_limit", 10.0, "CP-SAT budget per search.")
flags.DEFINE_integer("profile_rounds", 3, "Times each layer is measured (the"
                     " smallest kept).")
flags.DEFINE_integer("seed", 0, "Parameter, data and CP-SAT seed.")
flags.DEFINE_string("cache_dir", None, "Profile cache (default:"
                    " $TESSEL_JAX_CACHE or ~/.cache/tessel_jax).")
flags.DEFINE_bool("fresh_cache", True, "Without --cache_dir: measure into a"
                  " new temporary cache (no earlier measurement reused).")
flags.DEFINE_string("output_dir", "results/inference",
                    "Folder of the results (run_<hash of the flags>.json).")


def devices_flag() -> int:
  """``--devices`` (read before jax starts)."""
  return flags.FLAGS.devices


def check_outputs() -> None:
  """Checks ``--cache_dir`` and ``--output_dir`` (read before jax starts).

  Raises:
    app.UsageError: naming the flag and the fix.
  """
  cli.check_created(flags.FLAGS.cache_dir, "--cache_dir", folder=True)
  cli.check_created(flags.FLAGS.output_dir, "--output_dir", folder=True)


def from_flags():
  """Reads the parsed flags into ``inference_lib.InferenceArgs``.

  Imports ``inference_lib`` (and so jax): call it after setting XLA_FLAGS.

  Raises:
    app.UsageError: for malformed or out-of-range flags.
  """
  # pylint: disable-next=import-outside-toplevel
  from experiments.inference_lib import InferenceArgs, check_args
  f = flags.FLAGS
  try:
    microbatches = tuple(int(n) for n in f.microbatches)
  except ValueError:
    raise app.UsageError(f"--microbatches takes integers, got"
                         f" {','.join(f.microbatches)}") from None
  args = InferenceArgs(
      placements=tuple(f.placements), devices=f.devices,
      microbatches=microbatches, vocab=f.vocab, d_model=f.d_model,
      layers=f.layers, heads=f.heads, seq=f.seq, rows=f.rows,
      measure=f.measure, repeats=f.repeats, time_limit=f.time_limit,
      profile_rounds=f.profile_rounds,
      seed=f.seed, cache_dir=f.cache_dir, fresh_cache=f.fresh_cache,
      output_dir=f.output_dir)
  try:
    check_args(args)
  except ValueError as e:
    raise app.UsageError(str(e)) from None
  return args
