"""Flags of ``python -m experiments.model_zoo``, read into ``ZooArgs``.

Importing this module defines the flags; only the binary imports it. It imports
no jax (``from_flags`` imports ``model_zoo_lib`` once the flags are checked),
so ``--help`` stays cheap.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from absl import app, flags

from experiments import cli
from tessel_jax import placements

if TYPE_CHECKING:
  from experiments.model_zoo_lib import ZooArgs

flags.DEFINE_list("models", ["nnx_transformer", "nnx_bn_cnn", "eqx_mlp",
                            "eqx_transformer", "penzai_llama",
                            "penzai_llama8", "hf_gpt2"],
                  "Models (experiments/model_zoo_models.py); a model whose"
                  " package is missing is recorded as skipped.")
flags.DEFINE_list("placements", ["vshape", "mshape", "nnshape"],
                  "Named placements (tj.placements) to schedule on.")
flags.DEFINE_list("modes", ["train", "infer"], "train and/or infer.")
flags.DEFINE_integer("devices", 4, "Devices on the pipe axis (fake CPU"
                     " devices).")
flags.DEFINE_integer("microbatches", 4, "Micro-batches N per step.")
flags.DEFINE_integer("rows", 4, "Rows per micro-batch.")
flags.DEFINE_integer("repeats", 5, "Timed calls per steady step (median).")
flags.DEFINE_enum("cost", "uniform", ["uniform", "measured"],
                  "Block costs of the search (tj.schedule's cost=).")
flags.DEFINE_float("tolerance", 1e-5, "Largest relative error counted ok.")
flags.DEFINE_string("output_dir", "results/model_zoo",
                    "Folder of the JSON result (run_<hash>.json).")
flags.DEFINE_string("markdown", None, "Also write the table here (.md).")


def from_flags() -> ZooArgs:
  """Reads the parsed flags into ``ZooArgs``.

  Raises:
    app.UsageError: for unknown models, placements or modes, or numbers out
      of range.
  """
  f = flags.FLAGS
  cli.check_created(f.output_dir, "--output_dir", folder=True)
  cli.check_created(f.markdown, "--markdown", suffixes=cli.TEXT_SUFFIXES)
  models = tuple(m.strip() for m in f.models if m.strip())
  from experiments.model_zoo_models import BUILDERS  # pylint: disable=import-outside-toplevel
  bad = [m for m in models if m not in BUILDERS]
  if bad or not models:
    raise app.UsageError(f"--models: unknown {bad}; choose from"
                         f" {sorted(BUILDERS)}")
  known = sorted(placements.PLACEMENTS)
  pls = tuple(p.strip() for p in f.placements if p.strip())
  if not pls or any(p not in known for p in pls):
    raise app.UsageError(f"--placements: {list(pls)}; choose from {known}")
  modes = tuple(m.strip() for m in f.modes if m.strip())
  from experiments.model_zoo_lib import MODES, ZooArgs  # pylint: disable=import-outside-toplevel
  if not modes or any(m not in MODES for m in modes):
    raise app.UsageError(f"--modes: {list(modes)}; choose from {MODES}")
  for name in ("devices", "microbatches", "rows", "repeats"):
    if getattr(f, name) < 1:
      raise app.UsageError(f"--{name} must be >= 1, got {getattr(f, name)}")
  if f.tolerance <= 0:
    raise app.UsageError(f"--tolerance must be > 0, got {f.tolerance}")
  return ZooArgs(models=models, placements=pls, modes=modes,
                 devices=f.devices, microbatches=f.microbatches, rows=f.rows,
                 repeats=f.repeats, cost=f.cost, tolerance=f.tolerance,
                 output_dir=f.output_dir, markdown=f.markdown)
