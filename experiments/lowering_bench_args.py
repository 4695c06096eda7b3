"""Flags of ``python -m experiments.lowering_bench``, read into ``BenchArgs``.

Importing this module defines the flags; only the binary imports it. It imports
no jax (``from_flags`` imports ``lowering_bench_lib`` once the flags are
checked), so ``--help`` stays cheap.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from absl import app, flags

from experiments import cli

if TYPE_CHECKING:
  from experiments.lowering_bench_lib import BenchArgs

flags.DEFINE_list("parts", ["compile", "memory", "speedup"],
                  "What to measure: compile (time vs N), memory"
                  " (memory_analysis vs predicted, HLO stash copies), speedup"
                  " (2 single-threaded devices vs 1), profile (see"
                  " --profile).")
flags.DEFINE_bool("profile", False, "Only the profile part: a step of each"
                  " --profile_models x --profile_plans on vshape(2) split"
                  " into kernels, ppermute/rendezvous, stash, gradient"
                  " accumulation, switch/loop overhead and idle time, from"
                  " XLA's trace (experiments.step_profile).")
flags.DEFINE_list("profile_models", ["mlp", "gpt", "wide"],
                  "Models of the profile: mlp (4x1024, 256 rows), gpt (the"
                  " README's), wide (4x1664, 11.1M parameters, 32 rows),"
                  " resnet18 (experiments.resnet, 11.7M parameters).")
flags.DEFINE_list("profile_plans", ["searched", "gpipe", "1f1b"],
                  "Plans of the profile (searched: the default search);"
                  " <plan>_nohoist: lowered without hoisting the kernels'"
                  " parameter-only work out of the tick loop.")
flags.DEFINE_integer("profile_n", 8, "Micro-batches of the profile.")
flags.DEFINE_enum("profile_cost", "measured", ["measured", "uniform"],
                  "cost= of the profiled schedules.")
flags.DEFINE_list("placed_models", ["wide", "resnet18"],
                  "Models of the placed part: wide (4x1664 MLP, 11.1M"
                  " parameters), resnet18 (experiments.resnet, 11.7M,"
                  " param_layout='slots'), resnet18_auto (the same,"
                  " param_layout='auto'), resnet18_flat (the same,"
                  " param_layout='flat': one flat buffer).")
flags.DEFINE_integer("placed_n", 8, "Micro-batches of the placed part.")
flags.DEFINE_enum("placed_cost", "uniform", ["measured", "uniform"],
                  "cost= of the placed part (measured: also the kernels'"
                  " times measured alone, summed along the busiest device).")
flags.DEFINE_bool("keep_pages", False,
                  "Run the placed and profile workers with glibc malloc"
                  " keeping its pages between calls (one arena, no mmap, no"
                  " trimming: experiments.host_pages), so XLA's per-call"
                  " temp and output buffers are not page-faulted afresh"
                  " every step.")
flags.DEFINE_list("compile_n", ["8", "32", "128", "256"],
                  "Micro-batch counts for the compile-time part.")
flags.DEFINE_string("placement", "vshape", "Placement of the compile and"
                    " memory parts.")
flags.DEFINE_integer("devices", 4, "Devices of the compile and memory parts.")
flags.DEFINE_integer("speed_hidden", 1024, "Width of the speed-up model.")
flags.DEFINE_integer("speed_layers", 4, "Layers of the speed-up model.")
flags.DEFINE_integer("speed_rows", 512, "Rows per micro-batch (speed-up).")
flags.DEFINE_integer("speed_n", 16, "Micro-batches of the speed-up part.")
flags.DEFINE_enum("speed_cut", "auto", ["markers", "auto"],
                  "How the speed-up model is cut into its 2 blocks: at its"
                  " tj.boundary markers (2 layers each) or by measured cost"
                  " (tessel_jax's automatic cut).")
flags.DEFINE_integer("repeats", 5, "Timed runs per measurement (median kept).")
flags.DEFINE_string("output", "out/lowering_bench.json",
                    "Where to write the JSON results ('': stdout only).")
flags.DEFINE_string("worker", None, "Internal: run one speed-up worker"
                    " ('plain' or 'pipe') and print its JSON.")


def from_flags() -> BenchArgs:
  """Reads the parsed flags into ``BenchArgs``.

  Raises:
    app.UsageError: for unknown parts or out-of-range numbers.
  """
  f = flags.FLAGS
  cli.check_created(f.output, "--output", suffixes=(".json",))
  from experiments.lowering_bench_lib import PARTS, BenchArgs  # pylint: disable=import-outside-toplevel
  bad = [p for p in f.parts if p not in PARTS]
  if bad:
    raise app.UsageError(f"unknown --parts {bad}; choose from {PARTS}")
  try:
    ns = tuple(int(n) for n in f.compile_n)
  except ValueError:
    raise app.UsageError(f"--compile_n must be integers: {f.compile_n}") from None
  if f.worker not in (None, "plain", "pipe", "profile", "placed", "plain1",
                      "plain2"):
    raise app.UsageError("--worker is internal ('plain', 'pipe', 'profile',"
                         " 'placed', 'plain1', 'plain2')")
  bad = [m for m in f.placed_models
         if m not in ("wide", "resnet18", "resnet18_auto", "resnet18_flat")]
  if bad:
    raise app.UsageError(f"unknown --placed_models {bad}; choose from wide,"
                         f" resnet18, resnet18_flat")
  bad = [m for m in f.profile_models
         if m not in ("mlp", "gpt", "wide", "resnet18")]
  bad += [p for p in f.profile_plans
          if p.removesuffix("_nohoist") not in ("searched", "gpipe", "1f1b")]
  if bad:
    raise app.UsageError(f"unknown --profile_models/--profile_plans {bad}")
  if f.speed_layers % 2:
    raise app.UsageError("--speed_layers must be even (two pipeline stages)")
  return BenchArgs(parts=("profile",) if f.profile else tuple(f.parts),
                   compile_n=ns, placement=f.placement,
                   devices=f.devices, speed_hidden=f.speed_hidden,
                   speed_layers=f.speed_layers, speed_rows=f.speed_rows,
                   speed_n=f.speed_n, speed_cut=f.speed_cut,
                   repeats=f.repeats,
                   output=f.output or None, worker=f.worker,
                   profile_models=tuple(f.profile_models),
                   profile_plans=tuple(f.profile_plans),
                   profile_n=f.profile_n, profile_cost=f.profile_cost,
                   placed_models=tuple(f.placed_models),
                   placed_n=f.placed_n, placed_cost=f.placed_cost,
                   keep_pages=f.keep_pages)
