"""Why ``cost="measured"`` prices eqx_mlp's ticks below its own stand-in
(a diagnostic, helper zoo8, session 32; BENCHMARKS.md).

  TESSEL_JAX_CACHE=$(mktemp -d) python -m experiments.port_record_probe \\
      --models=nnx_bn_cnn,eqx_mlp [--realtime]

A fresh cache makes the first model built measure the machine's per-port
record. One JSON line per model on stdout; the fields are described in
``experiments.port_record_probe_lib``.
"""

from absl import flags

from experiments import cli, model_zoo_flags, port_record_probe_args

# --help lists the flags of port_record_probe_args (defined there, read here).
flags.adopt_module_key_flags(port_record_probe_args)


def main(argv: list[str]) -> None:
  cli.no_arguments(argv)
  model_zoo_flags.two_devices()  # before from_flags, which imports jax
  args = port_record_probe_args.from_flags()
  from experiments import port_record_probe_lib  # pylint: disable=import-outside-toplevel
  port_record_probe_lib.main(args)


if __name__ == "__main__":
  cli.run(main)
