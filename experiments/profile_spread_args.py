"""Flags of ``python -m experiments.profile_spread``, read into
``SpreadArgs``: the zoo runners' ``--models``, ``--microbatches`` and
``--rows`` (``experiments.model_zoo_flags``) and the runner's own.

Importing this module defines the flags; only the binary imports it. It
does not import jax (the binary sets the fake device count first).
"""

from __future__ import annotations

import dataclasses

from absl import flags

from experiments import model_zoo_flags

flags.DEFINE_integer("builds", 8, "Profiles of each model's kernels after"
                     " its build (each from scratch).")
flags.DEFINE_bool("fresh_overhead", False, "Re-measure what a call costs"
                  " (call_timing.call_overhead, once per process otherwise)"
                  " before each profile, as a new process would.")
flags.DEFINE_bool("fused_pairs", False, "Each build profiles the kernels"
                  " twice, TESSEL_JAX_FUSED_GRADS off and on (alternating"
                  " order): one spread per pricing (cost.fused_grads).")
flags.DEFINE_bool("realtime", True, "Every thread at real-time priority from"
                  " the first build on, as model_zoo_spans times.")


@dataclasses.dataclass(frozen=True)
class SpreadArgs:
  """The runner's arguments (see the flags)."""
  models: tuple[str, ...]
  microbatches: int
  rows: int
  builds: int
  fresh_overhead: bool
  realtime: bool
  fused_pairs: bool = False


def from_flags() -> SpreadArgs:
  """Reads the parsed flags into ``SpreadArgs`` (imports jax: call it after
  ``model_zoo_flags.two_devices``).

  Raises:
    app.UsageError: for unknown models or numbers below 1.
  """
  models, microbatches, rows = model_zoo_flags.read()
  model_zoo_flags.check_positive("builds")
  f = flags.FLAGS
  return SpreadArgs(models=models, microbatches=microbatches, rows=rows,
                    builds=f.builds, fresh_overhead=f.fresh_overhead,
                    realtime=f.realtime, fused_pairs=f.fused_pairs)
