"""Flags of ``python -m experiments.model_zoo_spans``, read into
``SpansArgs``.

Importing this module defines the flags; only the binary imports it. It
does not import jax (the binary sets the fake device count first).
"""

from __future__ import annotations

from absl import app, flags

from experiments import cli, model_zoo_flags

flags.adopt_module_key_flags(model_zoo_flags)
flags.DEFINE_integer("rounds", 7, "Timing rounds (both candidates once per"
                     " round, shuffled).")
flags.DEFINE_bool("realtime", True, "Time at real-time priority (every"
                  " thread SCHED_RR while timing; needs root or"
                  " CAP_SYS_NICE, else normal priority).")
flags.DEFINE_enum("cost", "calibrated", ["measured", "calibrated"],
                  "tj.schedule's cost: 'measured' (the default there: the"
                  " per-port cost measured once per machine, see"
                  " --reference) or 'calibrated' (each plan's stand-in).")
flags.DEFINE_string("reference", "nnx_bn_cnn", "With --cost=measured: the"
                    " model whose first plan's stand-in measures the"
                    " machine's per-port cost (tessel_jax.cost.ports) before"
                    " the table's models are built, so none of them is its"
                    " own reference; '' leaves it to the first model.")
flags.DEFINE_bool("price_after", True, "After each model's timing rounds,"
                  " profile and price both candidates again on an empty"
                  " cache: the two predictions bracket the rounds and show"
                  " how far a new profile moves the price"
                  " (predicted_after_ms, drift, measured_over_bracket).")
flags.DEFINE_integer("seed", 0, "CP-SAT and round-order seed.")
flags.DEFINE_string("output", "results/model_zoo/spans.json",
                    "JSON results (a .md table beside it); '': print only.")


def from_flags():
  """Reads the parsed flags into ``model_zoo_spans_lib.SpansArgs``.

  Imports the lib (and so jax): call it after setting XLA_FLAGS.

  Raises:
    app.UsageError: for unknown models or out-of-range numbers.
  """
  # pylint: disable-next=import-outside-toplevel
  from experiments.model_zoo_spans_lib import BUILDERS, SpansArgs
  f = flags.FLAGS
  models, microbatches, rows = model_zoo_flags.read()
  model_zoo_flags.check_positive("rounds")
  if f.reference and f.reference not in BUILDERS:
    raise app.UsageError(f"--reference {f.reference!r}: choose from"
                         f" {sorted(BUILDERS)} or ''")
  return SpansArgs(models=models, microbatches=microbatches,
                   rows=rows, rounds=f.rounds, realtime=f.realtime,
                   seed=f.seed, output=f.output or None, cost=f.cost,
                   reference=f.reference or None,
                   price_after=f.price_after)


def check_output() -> None:
  """Checks ``--output`` before jax starts (``app.UsageError``)."""
  cli.check_created(flags.FLAGS.output, "--output", suffixes=(".json",))
