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

import sys

from absl import flags

from experiments import cli, model_zoo_flags

flags.adopt_module_key_flags(model_zoo_flags)
flags.DEFINE_integer("traces", 3, "Traced steps per model (median kept).")
flags.DEFINE_integer("rounds", 5, "Alternated rounds timing the real and"
                     " stand-in programs (medians kept).")
flags.DEFINE_bool("realtime", True, "Time at real-time priority where"
                  " allowed (experiments.realtime).")
flags.DEFINE_string("reference", "nnx_bn_cnn", "Model the per-thunk figure"
                    " is fitted on (timed first; '': none): its kernels'"
                    " paired real - stand-in less their loop figure, per"
                    " thunk on the lockstep path; every row is then priced"
                    " as loop + thunks x that figure.")
flags.DEFINE_string("output", "results/model_zoo/kernels.json",
                    "JSON results (a .md table beside it); '': print only.")


def main(argv: list[str]) -> None:
  cli.no_arguments(argv)
  f = flags.FLAGS
  cli.check_created(f.output, "--output", suffixes=(".json",))
  model_zoo_flags.check_positive("traces")
  model_zoo_flags.check_positive("rounds")
  model_zoo_flags.two_devices()
  # pylint: disable-next=import-outside-toplevel
  from experiments import model_zoo_kernels_lib as lib
  models, microbatches, rows = model_zoo_flags.read()
  sys.exit(lib.main(lib.KernelsArgs(
      models=models, microbatches=microbatches, rows=rows,
      traces=f.traces, rounds=f.rounds, realtime=f.realtime, output=f.output or None,
      reference=f.reference or None)))


if __name__ == "__main__":
  cli.run(main)
