"""Flags every per-model zoo runner shares (``model_zoo_spans``,
``model_zoo_kernels``): which zoo models, micro-batches and rows.

Importing this module defines the flags; it does not import jax (the
binaries set the fake device count first): :func:`read` imports the zoo's
builders, so call it after ``xla_env`` has set the XLA flags.
"""

from __future__ import annotations

import os

from absl import app, flags

from experiments import xla_env

#: The zoo's models these runners build by default.
ZOO_MODELS = ("eqx_mlp", "eqx_transformer", "nnx_transformer",
              "penzai_llama", "hf_gpt2")

flags.DEFINE_list("models", list(ZOO_MODELS), "Zoo models (names of"
                  " experiments.model_zoo_models.BUILDERS).")
flags.DEFINE_integer("microbatches", 8, "Micro-batches N.")
flags.DEFINE_integer("rows", 4, "Rows per micro-batch.")


def two_devices() -> None:
  """2 fake single-threaded CPU devices, this process on 2 cores: before
  jax starts (XLA reads XLA_FLAGS when jax creates its CPU client)."""
  xla_env.add_xla_flags(xla_env.cpu_flags(2, single_thread=True),
                        force_platform=True)
  if hasattr(os, "sched_setaffinity"):
    os.sched_setaffinity(0, sorted(os.sched_getaffinity(0))[:2])


def check_positive(*names: str) -> None:
  """Raises ``app.UsageError`` unless every flag ``names`` is >= 1."""
  for key in names:
    value = getattr(flags.FLAGS, key)
    if value < 1:
      raise app.UsageError(f"--{key} must be >= 1, got {value}")


def read() -> tuple[tuple[str, ...], int, int]:
  """``(models, microbatches, rows)`` from the flags.

  Raises:
    app.UsageError: for unknown models or numbers below 1.
  """
  # pylint: disable-next=import-outside-toplevel
  from experiments.model_zoo_models import BUILDERS  # imports jax
  f = flags.FLAGS
  bad = [m for m in f.models if m not in BUILDERS]
  if bad or not f.models:
    raise app.UsageError(f"--models {f.models}: choose from"
                         f" {sorted(BUILDERS)}")
  check_positive("microbatches", "rows")
  return tuple(f.models), f.microbatches, f.rows
