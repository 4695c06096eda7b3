"""Measure the lowering: compile time vs N, memory, copies, real speed-up.

  python -m experiments.lowering_bench                 # everything
  python -m experiments.lowering_bench --parts=compile --compile_n=8,256
  python -m experiments.lowering_bench --profile --profile_models=mlp

Parts (JSON to --output):

* compile: lower + compile time for each N (ratio of the largest to the
  smallest N; the steady state is a fori_loop, so it should stay flat);
* memory: ``compiled.memory_analysis()`` against the plan's stash and the
  schedule's predicted peak, and HLO copies of stash-sized buffers inside
  the loop body (target 0);
* speedup: the same training step on 2 fake single-threaded CPU devices
  (vshape, 1F1B-like searched schedule) against one device running plain
  ``jax.jit(jax.value_and_grad)``, each in its own process
  (``--xla_cpu_multi_thread_eigen=false``, one intra-op thread), with wall
  and CPU seconds (CPU seconds show the work overhead even when other
  processes share the cores);
* placed (``--parts=placed``, not in the default parts): parameter-heavy
  models (``--placed_models``) on vshape(2): plain jit on 1 and 2 cores,
  the plain-tree call, the placed call (``step.place``) and the fused
  ``train_step``, interleaved, against the measured kernels along the
  busiest device (``experiments.placed_bench``);
* profile (``--profile``, not in the default parts): one step of the MLP,
  the README's GPT and a parameter-heavy MLP under each plan, split into
  kernels, ppermute/rendezvous, stash, gradient accumulation, switch/loop
  overhead and idle time from XLA's trace (``experiments.step_profile``).
"""

import sys

from absl import flags

from experiments import cli, xla_env
from experiments import lowering_bench_args

# --help lists the flags of lowering_bench_args (defined there, read by this binary).
flags.adopt_module_key_flags(lowering_bench_args)


def main(argv: list[str]) -> None:
  cli.no_arguments(argv)
  args = lowering_bench_args.from_flags()
  # XLA reads XLA_FLAGS when jax creates its CPU client (first device use).
  if args.worker == "plain2":  # plain jit, default Eigen threading
    flags = xla_env.cpu_flags(1)
  elif args.worker is not None:
    flags = xla_env.cpu_flags(1 if args.worker in ("plain", "plain1") else 2,
                              single_thread=True)
  else:
    flags = xla_env.cpu_flags(max(args.devices, 8))
  xla_env.add_xla_flags(flags)
  from experiments import lowering_bench_lib  # pylint: disable=import-outside-toplevel
  sys.exit(lowering_bench_lib.main(args))


if __name__ == "__main__":
  cli.run(main)
