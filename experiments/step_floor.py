"""What a step's call pays regardless of its kernels (issue 15).

  python -m experiments.step_floor                       # 5 zoo models, ~5 min
  python -m experiments.step_floor --models=eqx_mlp --rounds=15

On 2 fake single-threaded CPU devices (as ``experiments.model_zoo_spans``):
zero-work programs of 1, 4, 16, 64 leaves in and out (a plain ``jit`` and a
``shard_map`` of one ``ppermute`` per leaf), then each zoo model's lowered
step timed beside a zero-work program with the step's own leaves in and
out, with the prediction's per-step terms (``outside_ms``, ticks, tick and
barrier figures). See ``experiments.step_floor_lib``.
"""

import sys

from absl import flags

from experiments import cli, model_zoo_flags, step_floor_args

flags.adopt_module_key_flags(step_floor_args)


def main(argv: list[str]) -> None:
  cli.no_arguments(argv)
  step_floor_args.check_output()
  model_zoo_flags.two_devices()
  # pylint: disable-next=import-outside-toplevel
  from experiments import step_floor_lib
  sys.exit(step_floor_lib.main(step_floor_args.from_flags()))


if __name__ == "__main__":
  cli.run(main)
