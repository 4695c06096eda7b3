"""Flags of ``experiments.compact_bench`` (read by the binary)."""

from __future__ import annotations

from typing import NamedTuple

from absl import flags

flags.DEFINE_enum("model", "mlp", ["mlp", "gpt"],
                  "mlp: peer_bench's MLP (4 x 1024, 256 rows, vshape(2), 2"
                  " single-threaded fake devices); gpt: the README's main"
                  " job (GPT, mshape(4), 4 fake devices).")
flags.DEFINE_list("ns", ["8", "32"], "Micro-batches (mlp; the gpt uses 16).")
flags.DEFINE_integer("repeats", 9, "Timed calls per variant (interleaved).")
flags.DEFINE_bool("realtime", True, "Time at SCHED_RR priority on cores 0-1"
                  " (needs root; the build runs at normal priority).")
flags.DEFINE_string("output", "results/compact_bench/compact_bench.json",
                    "JSON results ('' for none).")


class CompactArgs(NamedTuple):
  model: str = "mlp"
  ns: tuple[int, ...] = (8, 32)
  repeats: int = 9
  realtime: bool = True
  output: str | None = None


def from_flags() -> CompactArgs:
  f = flags.FLAGS
  return CompactArgs(model=f.model, ns=tuple(int(n) for n in f.ns),
                     repeats=f.repeats, realtime=f.realtime,
                     output=f.output or None)
