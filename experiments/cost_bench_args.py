"""Flags of ``python -m experiments.cost_bench``, read into ``CostBenchArgs``.

Importing this module defines the flags; only the binary imports it. It imports
no jax (``from_flags`` imports ``cost_bench_lib`` once the flags are checked),
so ``--help`` stays cheap.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from absl import app, flags

from experiments import cli

if TYPE_CHECKING:
  from experiments.cost_bench_lib import CostBenchArgs

flags.DEFINE_list("parts", ["accuracy", "profiling"],
                  "What to measure: accuracy (predicted vs measured step"
                  " time), profiling (cold and cached profiling of a GPT).")
flags.DEFINE_list("placements", ["vshape", "mshape"],
                  "Placements of the accuracy part (2 devices).")
flags.DEFINE_list("microbatches", ["8", "32"],
                  "Micro-batch counts of the accuracy part.")
flags.DEFINE_integer("hidden", 512, "Width of the accuracy model (an MLP).")
flags.DEFINE_integer("rows", 128, "Rows per micro-batch (accuracy).")
flags.DEFINE_integer("layers_per_block", 2, "Layers per block (accuracy).")
flags.DEFINE_integer("repeats", 11, "Timed steps per case (median kept).")
flags.DEFINE_integer("gpt_layers", 12, "Layers of the profiled GPT.")
flags.DEFINE_integer("gpt_devices", 4, "Devices of the profiled GPT.")
flags.DEFINE_integer("gpt_d_model", 64, "Width of the profiled GPT.")
flags.DEFINE_string("cache_dir", None,
                    "Measurement cache shared by the accuracy cases (default:"
                    " a fresh temporary directory per case, so every case"
                    " profiles right before its steps are timed; the"
                    " profiling part always starts cold).")
flags.DEFINE_bool("realtime", True,
                  "Run the accuracy workers at real-time priority (SCHED_RR"
                  " 10) where allowed, so other jobs on a shared machine do"
                  " not disturb the profile and the timed steps.")
flags.DEFINE_string("output", "out/cost_bench.json",
                    "Where to write the JSON results ('': stdout only).")
flags.DEFINE_string("worker", None, "Internal: run one accuracy case"
                    " ('placement:N') and print its JSON.")


def from_flags() -> CostBenchArgs:
  """Reads the parsed flags into ``CostBenchArgs``.

  Raises:
    app.UsageError: for unknown parts or out-of-range numbers.
  """
  f = flags.FLAGS
  cli.check_created(f.cache_dir, "--cache_dir", folder=True)
  cli.check_created(f.output, "--output", suffixes=(".json",))
  from experiments.cost_bench_lib import PARTS, CostBenchArgs  # pylint: disable=import-outside-toplevel
  bad = [p for p in f.parts if p not in PARTS]
  if bad:
    raise app.UsageError(f"unknown --parts {bad}; choose from {PARTS}")
  try:
    ns = tuple(int(n) for n in f.microbatches)
  except ValueError:
    raise app.UsageError(
        f"--microbatches must be integers: {f.microbatches}") from None
  for name in ("hidden", "rows", "layers_per_block", "repeats", "gpt_layers",
               "gpt_devices", "gpt_d_model"):
    if getattr(f, name) < 1:
      raise app.UsageError(f"--{name} must be >= 1, got {getattr(f, name)}")
  if f.rows % 2:
    raise app.UsageError("--rows must be even (mshape shares its first block"
                         " over the 2 devices)")
  return CostBenchArgs(
      parts=tuple(f.parts), placements=tuple(f.placements), microbatches=ns,
      hidden=f.hidden, rows=f.rows, layers_per_block=f.layers_per_block,
      repeats=f.repeats, gpt_layers=f.gpt_layers, gpt_devices=f.gpt_devices,
      gpt_d_model=f.gpt_d_model, cache_dir=f.cache_dir or None,
      realtime=f.realtime,
      output=f.output or None, worker=f.worker)
