"""Race tessel_jax's lowered programs against hand-written JAX peers.

  python -m experiments.peer_bench                    # the issue-15 table
  python -m experiments.peer_bench --rounds=3 --ns=8  # quicker
  python -m experiments.peer_bench --stages=4         # the 4-stage work ratio

An MLP (``--layers`` x ``tanh(h @ W + b)``, width ``--hidden``, ``--rows``
rows per micro-batch) trained for one step, N = ``--ns``, on 2 fake
single-threaded CPU devices pinned to 2 cores
(``--xla_force_host_platform_device_count=2 --xla_cpu_multi_thread_eigen=false
intra_op_parallelism_threads=1``): plain ``jax.jit`` on one device pinned to
one core and given both cores, 2-way data parallel (``shard_map``), a
hand-written GPipe (``experiments.peer_gpipe``: ``shard_map`` + ``ppermute``,
stacked stage params, a scan over N + S - 1 ticks, ``jax.grad`` through it),
and tessel_jax on ``vshape(2)``: searched, ``plan="gpipe"``,
``plan="1f1b"`` and the searched schedule lowered compact
(``tj_compact``: ``interpret_ramps=0``, each kernel body once). MaxText's
pipeline layer is an optional peer not installed here (recorded as skipped).

``--stages=4`` puts the pipelined variants on 4 fake devices (still on the
same 2 cores; 8 layers by default) for the issue's work ratio: the hand
GPipe (4 stages of 2 layers), tessel_jax's ``plan="gpipe"`` on
``vshape(4)``, and the schedules searched on ``mshape(4)`` (the first 4
layers on all devices, rows split, then one layer per device) and
``zbv(4)`` (8 one-layer stages, two per device, split backward); plain
``jax.jit`` on one core gives the useful work. Every device holds 2 layers'
work per micro-batch in each.

Per variant: median step ms over quiet rounds, CPU ms, paired ratios to the
hand-written GPipe (wall, and CPU: the work ratio), first call s (trace + search + compile + run), compile
s, XLA temp bytes (``compiled.memory_analysis()``) and HLO size. Every
variant is timed once per round in shuffled order; ``/proc/stat`` is read
around each timing and a round is kept only when the rest of the machine
used under ``--quiet_cores`` cores throughout (if none is, all rounds are
used and the JSON says so). JSON to ``--output``, a Markdown table beside it.
The compile column is one compile per variant; ``experiments.peer_compile``
compiles the hand GPipe and tessel_jax's program side by side over many
rounds (paired ratios, also between code versions).
"""

import sys

from absl import flags

from experiments import cli, xla_env
from experiments import peer_bench_args

# --help lists the flags of peer_bench_args (defined there, read by this binary).
flags.adopt_module_key_flags(peer_bench_args)


def main(argv: list[str]) -> None:
  cli.no_arguments(argv)
  args = peer_bench_args.from_flags()
  if args.worker is not None:
    # XLA reads XLA_FLAGS when jax creates its CPU client (first device use).
    devices = args.stages if args.worker == "pipe" else 1
    xla_env.add_xla_flags(xla_env.cpu_flags(devices, single_thread=True),
                          force_platform=True)
  from experiments import peer_bench_lib  # pylint: disable=import-outside-toplevel
  sys.exit(peer_bench_lib.main(args))


if __name__ == "__main__":
  cli.run(main)
