"""How far a model's kernel profile moves between re-profiles in one
process (a diagnostic, helper zoo15, session 39; BENCHMARKS.md).

  TESSEL_JAX_CACHE=$(mktemp -d) python -m experiments.profile_spread \\
      [--models=hf_gpt2,...] [--builds=8] [--fresh_overhead] [--realtime]

Each model is built once (``cost="measured"``, as ``model_zoo_spans``
builds it); its kernels are then profiled ``--builds`` more times from
scratch (no memo, no disk cache). One JSON line per model on stdout; the
fields are described in ``experiments.profile_spread_lib``.
"""

from absl import flags

from experiments import cli, model_zoo_flags, profile_spread_args

# --help lists the flags of profile_spread_args (defined there, read here).
flags.adopt_module_key_flags(profile_spread_args)


def main(argv: list[str]) -> None:
  cli.no_arguments(argv)
  model_zoo_flags.two_devices()  # before from_flags, which imports jax
  args = profile_spread_args.from_flags()
  from experiments import profile_spread_lib  # pylint: disable=import-outside-toplevel
  profile_spread_lib.main(args)


if __name__ == "__main__":
  cli.run(main)
