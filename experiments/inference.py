"""Inference latency and throughput: M-shape and others against V-shape.

  python -m experiments.inference                  # 4 fake CPU devices
  python -m experiments.inference --microbatches=1,8 --nomeasure

Writes results/inference/run_<hash of the flags>.json; draw it with
``python -m experiments.inference_plot <that file>``.
"""

import os

from absl import flags

from experiments import cli
from experiments import inference_args

# --help lists the flags of inference_args (defined there, read by this binary).
flags.adopt_module_key_flags(inference_args)


def main(argv: list[str]) -> None:
  cli.no_arguments(argv)
  inference_args.check_outputs()
  # XLA reads XLA_FLAGS when jax creates its CPU client: set the fake
  # device count before anything imports jax.
  flag = ("--xla_force_host_platform_device_count="
          f"{inference_args.devices_flag()}")
  os.environ["XLA_FLAGS"] = " ".join(
      x for x in (os.environ.get("XLA_FLAGS", ""), flag) if x)
  os.environ.setdefault("JAX_PLATFORMS", "cpu")
  # pylint: disable-next=import-outside-toplevel
  from experiments import inference_lib
  results = inference_lib.run(inference_args.from_flags())
  print(inference_lib.summary(results))


if __name__ == "__main__":
  cli.run(main)
