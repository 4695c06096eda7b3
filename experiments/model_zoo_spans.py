"""Does ``cost="measured"`` lower the faster of its two schedules? The zoo.

  python -m experiments.model_zoo_spans                  # 5 models, ~10 min
  python -m experiments.model_zoo_spans --models=eqx_mlp --rounds=3

Each zoo model (training, ``vshape(2)``, ``cut="auto"``) on 2 fake
single-threaded CPU devices pinned to 2 cores: the schedule searched on
measured spans and the one searched on uniform spans, both predicted by the
cost model, both lowered and timed (shuffled rounds, real-time priority
where allowed); the table says which one ``tj.schedule`` chose, which one
measured faster, and measured over predicted. See
``experiments.model_zoo_spans_lib``.
"""

import sys

from absl import flags

from experiments import cli, model_zoo_flags, model_zoo_spans_args

flags.adopt_module_key_flags(model_zoo_spans_args)


def main(argv: list[str]) -> None:
  cli.no_arguments(argv)
  model_zoo_spans_args.check_output()
  model_zoo_flags.two_devices()
  # pylint: disable-next=import-outside-toplevel
  from experiments import model_zoo_spans_lib
  sys.exit(model_zoo_spans_lib.main(model_zoo_spans_args.from_flags()))


if __name__ == "__main__":
  cli.run(main)
