"""Flags of ``python -m experiments.port_record_probe``, read into
``ProbeArgs``: the zoo runners' ``--models``, ``--microbatches`` and
``--rows`` (``experiments.model_zoo_flags``; models default to the
reference CNN, then eqx_mlp) and the probe's own.

Importing this module defines the flags; only the binary imports it. It
does not import jax (the binary sets the fake device count first).
"""

from __future__ import annotations

import dataclasses

from absl import flags

from experiments import model_zoo_flags

flags.FLAGS.set_default("models", ["nnx_bn_cnn", "eqx_mlp"])
flags.DEFINE_integer("reps", 6, "Stand-in timings each way per model.")
flags.DEFINE_bool("realtime", False,
                  "Every thread at real-time priority from the first build"
                  " on, as model_zoo_spans times.")


@dataclasses.dataclass(frozen=True)
class ProbeArgs:
  """The probe's arguments (see the flags)."""
  models: tuple[str, ...]
  microbatches: int
  rows: int
  reps: int
  realtime: bool


def from_flags() -> ProbeArgs:
  """Reads the parsed flags into ``ProbeArgs`` (imports jax: call it after
  ``model_zoo_flags.two_devices``).

  Raises:
    app.UsageError: for unknown models or numbers below 1.
  """
  models, microbatches, rows = model_zoo_flags.read()
  model_zoo_flags.check_positive("reps")
  return ProbeArgs(models=models, microbatches=microbatches, rows=rows,
                   reps=flags.FLAGS.reps, realtime=flags.FLAGS.realtime)
