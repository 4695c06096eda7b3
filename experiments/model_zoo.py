"""Real models from their own packages through tj.schedule(cut="auto").

  python -m experiments.model_zoo --markdown=results/model_zoo/table.md
  python -m experiments.model_zoo --models=eqx_mlp --placements=vshape

flax.nnx, equinox, penzai and Hugging Face Flax models (tiny sizes, random
init, unmodified; ``pip install -e '.[models]'``) on V-shape, M-shape and
NN-shape over fake CPU devices, training and inference: the largest
relative error against ``jax.value_and_grad`` (or the plain function), the
first call and the steady step against the plain jitted step, and how every
shared block runs; a row that fails records its error and the run goes on.
JSON to ``--output_dir``, a Markdown table to ``--markdown``.
"""

import os
import sys

from absl import flags

from experiments import cli
from experiments import model_zoo_args

# --help lists the flags of model_zoo_args (defined there, read by this binary).
flags.adopt_module_key_flags(model_zoo_args)


def main(argv: list[str]) -> None:
  cli.no_arguments(argv)
  args = model_zoo_args.from_flags()
  # XLA reads XLA_FLAGS once, at its first device use: fake devices first.
  flag = f"--xla_force_host_platform_device_count={args.devices}"
  os.environ["XLA_FLAGS"] = " ".join(
      x for x in (os.environ.get("XLA_FLAGS", ""), flag) if x)
  os.environ.setdefault("JAX_PLATFORMS", "cpu")
  from experiments import model_zoo_lib  # pylint: disable=import-outside-toplevel
  sys.exit(model_zoo_lib.main(args))


if __name__ == "__main__":
  cli.run(main)
