"""Do the zoo's kernels run slower inside the lowered program than alone?

  python -m experiments.model_zoo_kernels                 # 5 models, ~4 min
  python -m experiments.model_zoo_kernels --models=eqx_mlp

Each zoo model (training, ``vshape(2)``, ``cut="auto"``, ``cost="measured"``)
on 2 fake single-threaded CPU devices pinned to 2 cores: every kernel's
profiled time beside its time inside the program (XLA's trace, split by the
kernels' name scopes), and the program's time outside its kernels beside
its stand-in program's step (the program ``cost.ports`` is fitted on). See
``experiments.model_zoo_kernels_lib``.
"""

import os
import sys

from absl import app, flags

from experiments import cli, xla_env

_MODELS = ("eqx_mlp", "eqx_transformer", "nnx_transformer", "penzai_llama",
           "hf_gpt2")

flags.DEFINE_list("models", list(_MODELS), "Zoo models (names of"
                  " experiments.model_zoo_models.BUILDERS).")
flags.DEFINE_integer("microbatches", 8, "Micro-batches N.")
flags.DEFINE_integer("rows", 4, "Rows per micro-batch.")
flags.DEFINE_integer("traces", 3, "Traced steps per model (median kept).")
flags.DEFINE_bool("realtime", True, "Time at real-time priority where"
                  " allowed (experiments.realtime).")
flags.DEFINE_string("output", "results/model_zoo/kernels.json",
                    "JSON results (a .md table beside it); '': print only.")


def main(argv: list[str]) -> None:
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {argv[1:]}")
  f = flags.FLAGS
  cli.check_created(f.output, "--output", suffixes=(".json",))
  for key in ("microbatches", "rows", "traces"):
    if getattr(f, key) < 1:
      raise app.UsageError(f"--{key} must be >= 1, got {getattr(f, key)}")
  xla_env.add_xla_flags(xla_env.cpu_flags(2, single_thread=True),
                        force_platform=True)
  if hasattr(os, "sched_setaffinity"):
    os.sched_setaffinity(0, sorted(os.sched_getaffinity(0))[:2])
  # pylint: disable-next=import-outside-toplevel
  from experiments import model_zoo_kernels_lib as lib
  bad = [m for m in f.models if m not in lib.BUILDERS]
  if bad or not f.models:
    raise app.UsageError(f"--models {f.models}: choose from"
                         f" {sorted(lib.BUILDERS)}")
  sys.exit(lib.main(lib.KernelsArgs(
      models=tuple(f.models), microbatches=f.microbatches, rows=f.rows,
      traces=f.traces, realtime=f.realtime, output=f.output or None)))


if __name__ == "__main__":
  cli.run(main)
