"""Flags of ``python -m experiments.train``, read into ``TrainArgs``.

Importing this module defines the flags; only the binary imports it. It
imports no jax (``from_flags`` does, once the flags are parsed), so the
binary's first line comes before jax's import.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from absl import app, flags, logging

from experiments import cli
from tessel_jax import checks  # imports no jax

if TYPE_CHECKING:
  from experiments.train_lib import TrainArgs

flags.DEFINE_string("placement", "mshape",
                    "Named placement (vshape, mshape, interleaved, ...); see"
                    " tessel_jax.placements.PLACEMENTS.")
flags.DEFINE_integer("devices", 4, "Devices on the pipeline axis.")
flags.DEFINE_integer("data", 1, "Data-parallel replicas (a 'data' mesh axis).")
flags.DEFINE_integer("layers", 4, "Transformer layers.")
flags.DEFINE_integer("d_model", 64, "Model width.")
flags.DEFINE_integer("heads", 4, "Attention heads.")
flags.DEFINE_integer("seq", 32, "Sequence length (characters).")
flags.DEFINE_integer("microbatches", 16, "Micro-batches per step.")
flags.DEFINE_integer("microbatch_size", 4, "Sequences per micro-batch.")
flags.DEFINE_integer("steps", 30, "Training steps.")
flags.DEFINE_float("lr", 3e-3, "Adam learning rate.")
flags.DEFINE_integer("seed", 0, "Random seed (data, init, CP-SAT).")
flags.DEFINE_string("schedule", None,
                    "Baseline instead of the search (gpipe, 1f1b, ...).")
flags.DEFINE_float("time_limit", 30.0, "CP-SAT time limit in seconds.")
flags.DEFINE_bool("check", True,
                  "Check step 0 against jax.value_and_grad of the plain"
                  " function (mean over micro-batches).")
flags.DEFINE_string("plot", "out/train_schedule.png",
                    "Where to save the schedule picture ('' : none).")
flags.DEFINE_string("output", "out/train.json",
                    "Where to write the JSON results ('' : none).")
flags.DEFINE_integer("grid_steps", 48, "Steps of the schedule grid to print.")
flags.DEFINE_enum("cost", None, ["measured", "uniform"],
                  "Block costs of the search: measured on the device"
                  " (cached) or uniform spans F=1, B=2, W=1 (default:"
                  " $TESSEL_JAX_COST, else measured).")
flags.DEFINE_bool("reprofile", False,
                  "Measure the blocks again even when they are cached.")
flags.DEFINE_integer("interpret_ramps", None,
                     "tj.schedule's interpret_ramps: ramps of at least this"
                     " many ticks run as one table-driven loop; 0: every"
                     " tick (each kernel compiled once); -1: unroll all."
                     " Default: tj.schedule's 'auto' (0, the compact"
                     " lowering).")
flags.DEFINE_integer("step_opt_level", None,
                     "XLA's xla_backend_optimization_level for the pipelined"
                     " step's compile only (default: XLA's own, 2). 1 cut"
                     " that compile to 0.79x wall quietly but its step ran"
                     " a median 1.07x wall / 1.03x CPU (BENCHMARKS.md,"
                     " session 41), so it is off.", lower_bound=0,
                     upper_bound=3)


def from_flags() -> TrainArgs:
  """Reads the parsed flags into ``TrainArgs``; once they are good, logs
  the run's first line and imports jax (``train_lib``).

  Raises:
    app.UsageError: for out-of-range flags.
  """
  f = flags.FLAGS
  cli.check_created(f.plot, "--plot", suffixes=checks.IMAGE_SUFFIXES)
  cli.check_created(f.output, "--output", suffixes=(".json",))
  for name in ("devices", "data", "layers", "d_model", "heads", "seq",
               "microbatches", "microbatch_size", "steps"):
    if getattr(f, name) < 1:
      raise app.UsageError(f"--{name} must be >= 1, got {getattr(f, name)}")
  if f.d_model % f.heads:
    raise app.UsageError(f"--d_model={f.d_model} must be a multiple of"
                         f" --heads={f.heads}")
  # The first line, once the flags are known good, before jax's import
  # (about a second): tessel_jax's progress lines follow, one per phase.
  logging.set_verbosity(logging.INFO)
  logging.info("train: %s on %d devices; importing jax", f.placement,
               f.devices)
  from experiments import train_lib  # pylint: disable=import-outside-toplevel
  return train_lib.TrainArgs(
      placement=f.placement, devices=f.devices, data=f.data, layers=f.layers,
      d_model=f.d_model, heads=f.heads, seq=f.seq,
      microbatches=f.microbatches, microbatch_size=f.microbatch_size,
      steps=f.steps, lr=f.lr, seed=f.seed, schedule=f.schedule,
      time_limit=f.time_limit, check=f.check, plot=f.plot or None,
      output=f.output or None, grid_steps=f.grid_steps, cost=f.cost,
      reprofile=f.reprofile, step_opt_level=f.step_opt_level,
      interpret_ramps=train_lib.interpret_ramps_for(f.steps,
                                                    f.interpret_ramps))
