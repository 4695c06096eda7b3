"""The cost of a row split to a weight gradient: 4 x 64 rows against 256.

Usage (pin to one core)::

  taskset -c 0 python -m experiments.rowsplit_dw --rounds=30

A block whose rows are split over 4 devices (``mshape(4)``'s first block)
computes each layer's weight gradient ``x.T @ dy`` on 64 rows per device and
adds it into that device's accumulator: per micro-batch 4 contractions of
depth 64 and 4 adds of the full weight, where one device owning the block
does one contraction of depth 256 and one add. Times both (with and without
the accumulation), shuffled per round, and prints median wall and process
CPU ms per 256 rows of one 1024 x 1024 layer.
"""

from __future__ import annotations

from absl import flags

from experiments import cli

flags.DEFINE_integer("rounds", 30, "Timed rounds (variants shuffled per round).")


def main(argv: list[str]) -> None:
  from experiments import rowsplit_dw_lib  # pylint: disable=import-outside-toplevel
  rowsplit_dw_lib.main(argv)


if __name__ == "__main__":
  cli.run(main)
