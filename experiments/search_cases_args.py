"""Flags of ``python -m experiments.search_cases``, read into ``CasesArgs``.

Importing this module defines the flags; only the binary imports it. It imports
no jax (``from_flags`` imports ``search_cases_lib`` once the flags are
checked), so ``--help`` stays cheap.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from absl import app, flags

from experiments import cli

if TYPE_CHECKING:
  from experiments.search_cases_lib import CasesArgs

flags.DEFINE_list("placements", None,
                  "Named placements to run (default: every one in"
                  " tessel_jax.placements.PLACEMENTS).")
flags.DEFINE_list("devices", ["4", "8", "16", "32"],
                  "Device counts; a placement runs only the counts it"
                  " accepts.")
flags.DEFINE_list("modes", ["train", "infer"], "Modes: train and/or infer.")
flags.DEFINE_list("memories", ["tight", "fast", "loose"],
                  "Memory cases for training graphs: tight (the smallest"
                  " limit that admits a schedule), fast (the smallest limit"
                  " that still reaches the fastest period), middle (halfway"
                  " between tight and fast, rounded down) and/or loose (no"
                  " limit).")
flags.DEFINE_integer("microbatches", 128, "Micro-batches N to unroll.")
flags.DEFINE_float("time_limit", 60.0,
                   "CP-SAT time limit per search (seconds).")
flags.DEFINE_integer("seed", 0, "CP-SAT random seed.")
flags.DEFINE_integer("workers", 1, "CP-SAT subsolvers (interleaved deterministically).")
flags.DEFINE_bool("no_wrap", False, "Forbid blocks wrapping the period end.")
flags.DEFINE_bool("fast_hint", True,
                  "Search the fast case from the repetend its memory search"
                  " found (at the fastest period under that limit);"
                  " --nofast_hint searches it from scratch.")
flags.DEFINE_string("output", None,
                    "Results JSON (default:"
                    " results/search_cases_<hash of the flags>.json).")
flags.DEFINE_string("markdown", None,
                    "Also write the markdown table here (it is always"
                    " printed).")


def from_flags() -> CasesArgs:
  """Reads the parsed flags into ``CasesArgs``.

  Raises:
    app.UsageError: for malformed or out-of-range flags.
  """
  f = flags.FLAGS
  cli.check_created(f.output, "--output", suffixes=(".json",))
  cli.check_created(f.markdown, "--markdown", suffixes=cli.TEXT_SUFFIXES)
  try:
    devices = tuple(int(d) for d in f.devices)
  except ValueError:
    raise app.UsageError(f"--devices must be integers, got {f.devices}"
                         ) from None
  if not devices or min(devices) < 1:
    raise app.UsageError(f"--devices must be >= 1, got {list(devices)}")
  bad = sorted(set(f.modes) - {"train", "infer"})
  if bad or not f.modes:
    raise app.UsageError(f"--modes takes train and/or infer, got {f.modes}")
  bad = sorted(set(f.memories) - {"tight", "middle", "fast", "loose"})
  if bad or not f.memories:
    raise app.UsageError(f"--memories takes tight, middle, fast and/or"
                         f" loose, got {f.memories}")
  if f.microbatches < 1 or f.workers < 1 or f.time_limit <= 0:
    raise app.UsageError("--microbatches and --workers must be >= 1 and"
                         " --time_limit > 0")
  from experiments.search_cases_lib import CasesArgs  # pylint: disable=import-outside-toplevel
  return CasesArgs(
      placements=tuple(f.placements) if f.placements else None,
      devices=devices, modes=tuple(f.modes), memories=tuple(f.memories),
      microbatches=f.microbatches, time_limit=f.time_limit, seed=f.seed,
      workers=f.workers, allow_wrap=not f.no_wrap, fast_hint=f.fast_hint,
      output=f.output,
      markdown=f.markdown)
