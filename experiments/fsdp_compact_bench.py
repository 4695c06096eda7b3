"""FSDP rows of ``experiments.tp_bench`` under the compact and loop lowerings,
paired in one process.

  python -m experiments.fsdp_compact_bench
  python -m experiments.fsdp_compact_bench --configs=pipe2_data2_fsdp_block --repeats=9
  python -m experiments.fsdp_compact_bench --configs=pipe2_data2_fsdp,pipe2_data2_fsdp_il \
      --interpret_ramps=0 --fsdp=per_step,per_block,auto --microbatches=8

Each config (a ``tp_bench`` FSDP mesh: ``pipe2_data2_fsdp`` per step,
``pipe2_data2_fsdp_block`` per block, ``_il`` the interleaved placement) is
built once per lowering (``tj.schedule(interpret_ramps=...)``: 0 compact,
the default; 8 loops) and, with ``--fsdp``, once per FSDP mode (instead of
the config's own), checked against ``jax.value_and_grad``, and timed with
every variant run once per round in a shuffled order. Prints the step's
wall and process-CPU medians, each round's wall and CPU ratio of every
variant to the config's first one (median over rounds), the compiled
argument + output + temp bytes per device, the predicted bytes
(``passes.program_bytes``) and how the FSDP parameters were gathered
(``step.report.lowering``). JSON to ``--output``.
"""

from absl import flags

from experiments import cli

FSDP_CONFIGS = ("pipe2_data2_fsdp", "pipe2_data2_fsdp_block",
                "pipe2_data2_fsdp_il", "pipe2_data2_fsdp_il_block")
flags.DEFINE_list("configs", list(FSDP_CONFIGS), "tp_bench FSDP configs.")
flags.DEFINE_list("interpret_ramps", ["0", "8"],
                  "Lowerings (tj.schedule's interpret_ramps); ratios are to"
                  " the first.")
flags.DEFINE_list("fsdp", [], "tj.schedule fsdp modes to build each config"
                  " with (ratios to the first); empty: the config's own.")
flags.DEFINE_integer("repeats", 7, "Timing rounds (each variant once per"
                     " round, shuffled).")
flags.DEFINE_integer("microbatches", 4, "Micro-batches per step (tp_bench's"
                     " default 4).")
flags.DEFINE_string("output", "out/fsdp_compact_bench.json", "JSON path.")


def main(argv: list[str]) -> None:
  from experiments import fsdp_compact_bench_lib  # pylint: disable=import-outside-toplevel
  fsdp_compact_bench_lib.main(argv)


if __name__ == "__main__":
  cli.run(main)
