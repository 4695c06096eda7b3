"""Flags of ``python -m experiments.tp_bench``, read into ``BenchArgs``.

Importing this module defines the flags; only the binary imports it. It imports
no jax (``from_flags`` imports ``tp_bench_lib`` once the flags are checked), so
``--help`` stays cheap.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from absl import app, flags

from experiments import cli

if TYPE_CHECKING:
  from experiments.tp_bench_lib import BenchArgs

flags.DEFINE_list("configs", [
                  "pipe4", "pipe2_model2", "pipe2_model2_replicated",
                  "pipe2_data2", "pipe2_data2_fsdp", "pipe2_data2_model2",
                  "model4", "pipe2_model2_unrolled",
                  "pipe2_data2_model2_unrolled", "data4",
                  "pipe2_data2_fsdp_block", "pipe2_data2_fsdp_il",
                  "pipe2_data2_fsdp_il_block"],
                  "Meshes to measure: pipe4, pipe2_model2 (Megatron weights"
                  " split over model), pipe2_model2_replicated (same mesh,"
                  " whole weights), pipe2_data2, pipe2_data2_fsdp (every"
                  " weight split over data, ZeRO-3), pipe2_data2_model2 (8"
                  " devices, Megatron weights), pipe2_model2_unrolled and"
                  " pipe2_data2_model2_unrolled (every ramp unrolled),"
                  " pipe2_data2_fsdp_block (ZeRO-3 per block),"
                  " pipe2_data2_fsdp_il and pipe2_data2_fsdp_il_block (FSDP"
                  " per step / per block on the interleaved placement, one"
                  " layer per block), model4"
                  " and data4 (plain"
                  " jax.jit of value_and_grad, no pipeline).")
flags.DEFINE_integer("hidden", 256, "Model width (MLP inner width 4x).")
flags.DEFINE_integer("layers", 4, "Layers (divisible by 4).")
flags.DEFINE_integer("vocab", 256, "Vocabulary (tied embedding).")
flags.DEFINE_integer("rows", 16, "Sequences per step.")
flags.DEFINE_integer("seq", 4, "Tokens per sequence.")
flags.DEFINE_integer("microbatches", 4, "Micro-batches per step.")
flags.DEFINE_integer("repeats", 7, "Timing rounds: every round runs each"
                     " config once, in a shuffled order (median kept).")
flags.DEFINE_integer("interpret_ramps", 8, "tj.schedule's interpret_ramps"
                     " for the pipelines (0: compact, every tick in one"
                     " table-driven loop; -1: unroll every ramp).")
flags.DEFINE_bool("realtime", False, "Run at real-time (round-robin)"
                  " priority (experiments.realtime): profiles and timed"
                  " steps undisturbed by other jobs on a shared machine"
                  " (needs root or CAP_SYS_NICE; the JSON says whether it"
                  " held).")
flags.DEFINE_enum("cost", "measured", ["measured", "uniform"],
                  "tj.schedule's cost= for the pipelines: 'measured' profiles"
                  " every kernel on one stage's devices (sharded) and"
                  " predicts the step time.")
flags.DEFINE_bool("kernel_spans", False, "Also trace a few steps of each"
                  " pipeline and compare every kernel's profiled"
                  " core-milliseconds with its own instructions' time in"
                  " the program (experiments.step_profile).")
flags.DEFINE_string("output", "out/tp_bench.json",
                    "Where to write the JSON results ('': stdout only).")


def from_flags() -> BenchArgs:
  """Reads the parsed flags into ``BenchArgs``.

  Raises:
    app.UsageError: for unknown configs or sizes that do not divide.
  """
  f = flags.FLAGS
  cli.check_created(f.output, "--output", suffixes=(".json",))
  from experiments.tp_bench_lib import CONFIGS, BenchArgs  # pylint: disable=import-outside-toplevel
  bad = [c for c in f.configs if c not in CONFIGS]
  if bad:
    raise app.UsageError(f"unknown --configs {bad}; choose from"
                         f" {list(CONFIGS)}")
  if f.layers % 4:
    raise app.UsageError("--layers must divide by 4 (pipe4 has 4 stages)")
  if f.rows % (4 * f.microbatches):
    raise app.UsageError("--rows must divide by 4 x --microbatches (data4"
                         " and the 4-way micro-batch split)")
  return BenchArgs(configs=tuple(f.configs), hidden=f.hidden,
                   layers=f.layers, vocab=f.vocab, rows=f.rows, seq=f.seq,
                   microbatches=f.microbatches, repeats=f.repeats,
                   interpret_ramps=(None if f.interpret_ramps < 0
                                    else f.interpret_ramps), cost=f.cost,
                   output=f.output or None, realtime=f.realtime,
                   kernel_spans=f.kernel_spans)
