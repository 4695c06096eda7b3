"""Flags of ``experiments.search_scaling``, read into ``ScalingArgs``.

Importing this module defines the flags; only the binary imports it. It imports
no jax (``from_flags`` imports ``search_scaling_lib`` once the flags are
checked), so ``--help`` stays cheap.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from absl import app, flags

from experiments import cli

if TYPE_CHECKING:
  from experiments.search_scaling_lib import ScalingArgs


flags.DEFINE_list("parts", ["devices", "memory", "microbatches", "time_limit"],
                  "Parts of the sweep: devices (search vs device count, no"
                  " memory limit), memory (tight/fast/loose limits), "
                  "microbatches (completion, unroll time and makespan vs N),"
                  " time_limit (best period so far and proven gap vs the"
                  " CP-SAT budget).")
flags.DEFINE_list("placements", None,
                  "Named placements (default: every one in"
                  " tessel_jax.placements.PLACEMENTS).")
flags.DEFINE_list("wrap", ["on", "off"],
                  "Wrap-around variants: on (blocks may wrap the period end),"
                  " off (Tessel's rule).")
flags.DEFINE_float("time_limit", 1.0,
                   "CP-SAT budget per search (deterministic seconds) in the"
                   " devices, memory and microbatches parts.")
flags.DEFINE_bool("complete", False,
                  "Also compact warmup/cooldown in the devices, memory and"
                  " time_limit parts (the microbatches part always does).")
flags.DEFINE_list("devices", ["4", "8", "16", "32", "64"],
                  "Device counts of the devices part.")
flags.DEFINE_list("memories", ["tight", "fast", "loose"],
                  "Memory cases of the memory part: tight (smallest limit"
                  " with any schedule), fast (smallest limit keeping the"
                  " fastest period), loose (none).")
flags.DEFINE_list("memory_devices", ["4", "8"],
                  "Device counts of the memory part.")
flags.DEFINE_float("memory_time_limit", 10.0,
                   "CP-SAT budget for finding the tight and fast limits.")
flags.DEFINE_list("microbatches", ["8", "32", "128", "512", "1024"],
                  "Micro-batch counts N of the microbatches part.")
flags.DEFINE_list("microbatch_devices", ["8"],
                  "Device counts of the microbatches part.")
flags.DEFINE_list("time_limits", ["0.25", "1", "2"],
                  "CP-SAT budgets of the time_limit part.")
flags.DEFINE_list("time_limit_devices", ["8"],
                  "Device counts of the time_limit part.")
flags.DEFINE_enum("time_limit_memory", "tight",
                  ["tight", "fast", "loose"],
                  "Memory case of the time_limit part (a"
                  " search_scaling_lib.MEMORY_CASES).")
flags.DEFINE_integer("seed", 0, "CP-SAT random seed.")
flags.DEFINE_integer("workers", 1,
                     "CP-SAT subsolvers (interleaved deterministically).")
flags.DEFINE_string("output_dir", "results/search_scaling",
                    "Folder of the results (run_<hash of the flags>.json).")


def _numbers(name: str, kind: type) -> tuple:
  values = getattr(flags.FLAGS, name)
  try:
    return tuple(kind(v) for v in values)
  except ValueError:
    raise app.UsageError(
        f"--{name} takes comma-separated {kind.__name__}s, got"
        f" {','.join(values)}") from None


def from_flags() -> ScalingArgs:
  """Reads the parsed flags into ``ScalingArgs``.

  Raises:
    app.UsageError: for malformed or out-of-range flags.
  """
  f = flags.FLAGS
  cli.check_created(f.output_dir, "--output_dir", folder=True)
  bad = [w for w in f.wrap if w not in ("on", "off")]
  if bad or not f.wrap:
    raise app.UsageError(f"--wrap takes on and/or off, got {f.wrap}")
  from experiments.search_scaling_lib import ScalingArgs, check_args  # pylint: disable=import-outside-toplevel
  args = ScalingArgs(
      parts=tuple(f.parts), placements=tuple(f.placements) if f.placements
      else None, wraps=tuple(w == "on" for w in f.wrap),
      time_limit=f.time_limit, complete=f.complete,
      devices=_numbers("devices", int), memories=tuple(f.memories),
      memory_devices=_numbers("memory_devices", int),
      memory_time_limit=f.memory_time_limit,
      microbatches=_numbers("microbatches", int),
      microbatch_devices=_numbers("microbatch_devices", int),
      time_limits=_numbers("time_limits", float),
      time_limit_devices=_numbers("time_limit_devices", int),
      time_limit_memory=f.time_limit_memory, seed=f.seed, workers=f.workers,
      output_dir=f.output_dir)
  try:
    check_args(args)
  except ValueError as e:
    raise app.UsageError(str(e)) from None
  return args
