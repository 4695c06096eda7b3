"""Flags of ``python -m experiments.auto_plan``, read into ``AutoPlanArgs``.

Importing this module defines the flags; only the binary imports it. It imports
no jax (``from_flags`` imports ``auto_plan_lib`` once the flags are checked),
so ``--help`` stays cheap.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from absl import app, flags

from experiments import cli

if TYPE_CHECKING:
  from experiments.auto_plan_lib import AutoPlanArgs

flags.DEFINE_string("model", "readme_gpt",
                    "The program: readme_gpt (the README's GPT, whose"
                    " --layers/--d_model/... flags apply) or a model-zoo"
                    " model (experiments.model_zoo_models, e.g. eqx_mlp,"
                    " nnx_transformer) with --microbatches x"
                    " --microbatch_size rows.")
flags.DEFINE_integer("devices", 4, "Fake CPU devices (1-D mesh).")
flags.DEFINE_integer("microbatches", 8, "Micro-batches N.")
flags.DEFINE_integer("microbatch_size", 4,
                     "Sequences per micro-batch.")
flags.DEFINE_integer("layers", 4, "Transformer layers.")
flags.DEFINE_integer("d_model", 64, "Model width.")
flags.DEFINE_integer("heads", 4, "Attention heads.")
flags.DEFINE_integer("seq", 32, "Sequence length.")
flags.DEFINE_integer("blocks", 5,
                     "Blocks made by the tj.boundary markers (other plans"
                     " are cut automatically).")
flags.DEFINE_list("memory_limits", ["none"],
                  "Bytes per device to choose under: none, 123, 512KiB,"
                  " 2MiB ..., or between:F (F of the way from the"
                  " smallest plan's peak to the unlimited choice's).")
flags.DEFINE_list("placements", None,
                  "Placements to try (default: every named one).")
flags.DEFINE_integer("measure_top", 8,
                     "Measure the chosen plan, the N fastest predicted"
                     " candidates (0: every candidate) and the fastest"
                     " predicted of each other placement.")
flags.DEFINE_integer("repeats", 5, "Timed steps per plan (median).")
flags.DEFINE_float("time_limit", 10.0, "CP-SAT budget per search.")
flags.DEFINE_string("cache_dir", None,
                    "Measurement and schedule cache (default: a fresh"
                    " temporary directory, so the first choice is cold).")
flags.DEFINE_string("output", "out/auto_plan.json", "JSON results ('': none).")
flags.DEFINE_bool("control", True,
                  "Also time the chosen plan built and compiled a second"
                  " time (a control row, never a candidate: the noise"
                  " floor of the ratios).")
flags.DEFINE_bool("price_stash", True,
                  "Price the classic schedules' stash beyond the searched"
                  " plan's (tessel_jax.auto.PRICE_STASH; --noprice_stash:"
                  " the pricing before session 32).")
flags.DEFINE_string("record_searches", None,
                    "Also write the schedule searches of the cold choice"
                    " here (JSON; input of experiments.auto_plan_unroll"
                    " --searches).")


def from_flags() -> AutoPlanArgs:
  """Reads the parsed flags into ``AutoPlanArgs``.

  Raises:
    app.UsageError: for out-of-range numbers.
  """
  f = flags.FLAGS
  cli.check_created(f.cache_dir, "--cache_dir", folder=True)
  cli.check_created(f.output, "--output", suffixes=(".json",))
  cli.check_created(f.record_searches, "--record_searches",
                    suffixes=(".json",))
  for name in ("devices", "microbatches", "microbatch_size", "layers",
               "d_model", "heads", "seq", "blocks", "repeats"):
    if getattr(f, name) < 1:
      raise app.UsageError(f"--{name} must be >= 1, got {getattr(f, name)}")
  from experiments import frontier_program  # pylint: disable=import-outside-toplevel
  if f.model not in frontier_program.programs():
    raise app.UsageError(f"--model={f.model}: choose from"
                         f" {', '.join(frontier_program.programs())}")
  from experiments.auto_plan_lib import BETWEEN, AutoPlanArgs, parse_limit  # pylint: disable=import-outside-toplevel
  for text in f.memory_limits:
    try:
      if text.strip().startswith(BETWEEN):
        frac = float(text.strip()[len(BETWEEN):])
        if not 0.0 <= frac <= 1.0:
          raise ValueError
      else:
        parse_limit(text)
    except ValueError:
      raise app.UsageError(
          f"--memory_limits: {text!r} is not none, a size (123, 512KiB,"
          f" 2MiB) or between:F with 0 <= F <= 1") from None
  if f.measure_top < 0:
    raise app.UsageError("--measure_top must be >= 0")
  return AutoPlanArgs(
      devices=f.devices, microbatches=f.microbatches,
      microbatch_size=f.microbatch_size, layers=f.layers, d_model=f.d_model,
      heads=f.heads, seq=f.seq, blocks=f.blocks,
      memory_limits=tuple(f.memory_limits),
      placements=tuple(f.placements) if f.placements else None,
      measure_top=f.measure_top, repeats=f.repeats, time_limit=f.time_limit,
      cache_dir=f.cache_dir or None, output=f.output or None, model=f.model,
      record_searches=f.record_searches or None, control=f.control,
      price_stash=f.price_stash)
