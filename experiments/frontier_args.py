"""Flags of ``python -m experiments.frontier``, read into ``FrontierArgs``.

Importing this module defines the flags; only the binary imports it. It imports
no jax (``from_flags`` imports ``frontier_lib`` once the flags are checked), so
``--help`` stays cheap.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from absl import app, flags

from experiments import cli

if TYPE_CHECKING:
  from experiments.frontier_lib import FrontierArgs


flags.DEFINE_enum("cost_source", "analytic", ["analytic", "measured"],
                  "Per-layer costs: analytic (a GPT preset priced from flops"
                  " and bytes, instant) or measured (a small GPT's layers"
                  " timed on this backend by tessel_jax's cost model).")
flags.DEFINE_string("model", "mt5_like",
                    "Analytic preset (cost_source=analytic: mt5_like,"
                    " gpt_small, tiny), or a real program: readme_gpt or a"
                    " model-zoo model, whose plans tj.frontier prices"
                    " (measured kernels with cost_source=measured, uniform"
                    " spans with analytic) on --devices fake CPU devices,"
                    " --microbatches x --gpt_rows batch rows.")
flags.DEFINE_integer("devices", 8, "Devices in all (pipe x dp).")
flags.DEFINE_list("placements", ["vshape", "interleaved", "mshape", "kshape",
                                "xshape", "mllm"],
                  "Placements to sweep, from vshape, interleaved, zbv,"
                  " mshape, mllm, nnshape, xshape, kshape.")
flags.DEFINE_list("pipes", None, "Devices per pipeline to try (default: every"
                  " divisor of --devices).")
flags.DEFINE_integer("microbatches", 32,
                     "Micro-batches per step in all (divided over the"
                     " data-parallel replicas).")
flags.DEFINE_list("memory_levels", ["0.5"],
                  "Stash limits between the tight and the loose one, as"
                  " fractions in (0, 1).")
flags.DEFINE_list("memory_limits", [], "Extra device memories to search under"
                  " (e.g. 8GiB,24GiB).")
flags.DEFINE_string("memory_limit", "16GiB",
                    "Device memory to choose the plan for (also searched"
                    " under); 'none' for the fastest plan.")
flags.DEFINE_float("link_latency_s", None, "Link latency in seconds (default:"
                   " the cost source's link).")
flags.DEFINE_float("link_bandwidth", None, "Link bandwidth in bytes/s"
                   " (default: the cost source's link).")
flags.DEFINE_integer("optimizer_slots", 2,
                     "Parameter-sized optimiser arrays (Adam: 2).")
flags.DEFINE_bool("shard_shared", False,
                  "Shard the parameters of multi-device blocks (gathered"
                  " before each use) instead of replicating them.")
flags.DEFINE_bool("baselines", True,
                  "Also evaluate the classic schedules that fit each"
                  " placement (GPipe, 1F1B, interleaved 1F1B, Chimera).")
flags.DEFINE_float("time_limit", 2.0,
                   "CP-SAT budget per search (deterministic seconds).")
flags.DEFINE_integer("seed", 0, "CP-SAT seed (and measured model seed).")
flags.DEFINE_integer("gpt_vocab", 4096, "Measured GPT: vocabulary.")
flags.DEFINE_integer("gpt_d_model", 64, "Measured GPT: width.")
flags.DEFINE_integer("gpt_layers", 6, "Measured GPT: layers.")
flags.DEFINE_integer("gpt_heads", 4, "Measured GPT: heads.")
flags.DEFINE_integer("gpt_seq", 32, "Measured GPT: sequence length.")
flags.DEFINE_integer("gpt_rows", 8,
                     "Measured GPT: sequences per micro-batch.")
flags.DEFINE_string("cache_dir", None, "Profile cache of the measured costs"
                    " (default: $TESSEL_JAX_CACHE or ~/.cache/tessel_jax).")
flags.DEFINE_string("output_dir", "results/frontier",
                    "Folder of the results (run_<hash of the flags>.json).")


def _parse(name: str, kind: type, values: list[str]) -> tuple:
  try:
    return tuple(kind(v) for v in values)
  except ValueError as e:
    raise app.UsageError(f"--{name}: {e}") from None


def from_flags() -> FrontierArgs:
  """Reads the parsed flags into ``FrontierArgs``.

  Raises:
    app.UsageError: for malformed or out-of-range flags.
  """
  f = flags.FLAGS
  cli.check_created(f.cache_dir, "--cache_dir", folder=True)
  cli.check_created(f.output_dir, "--output_dir", folder=True)
  from experiments import frontier_program  # pylint: disable=import-outside-toplevel
  from tessel_jax.search import frontier  # pylint: disable=import-outside-toplevel
  models = list(frontier.PRESETS) + list(frontier_program.programs())
  if f.model not in models:
    raise app.UsageError(f"--model={f.model}: choose from {', '.join(models)}")
  from experiments.frontier_lib import FrontierArgs, check_args, parse_bytes  # pylint: disable=import-outside-toplevel
  args = FrontierArgs(
      cost_source=f.cost_source, model=f.model, devices=f.devices,
      placements=tuple(f.placements),
      pipes=_parse("pipes", int, f.pipes) if f.pipes else None,
      microbatches=f.microbatches,
      memory_levels=_parse("memory_levels", float, f.memory_levels),
      memory_limits=_parse("memory_limits", parse_bytes, f.memory_limits),
      memory_limit=_parse("memory_limit", parse_bytes, [f.memory_limit])[0],
      link_latency_s=f.link_latency_s, link_bandwidth=f.link_bandwidth,
      optimizer_slots=f.optimizer_slots, shard_shared=f.shard_shared,
      baselines=f.baselines, time_limit=f.time_limit, seed=f.seed,
      gpt_vocab=f.gpt_vocab, gpt_d_model=f.gpt_d_model,
      gpt_layers=f.gpt_layers, gpt_heads=f.gpt_heads, gpt_seq=f.gpt_seq,
      gpt_rows=f.gpt_rows, cache_dir=f.cache_dir, output_dir=f.output_dir)
  if None in args.memory_limits:
    raise app.UsageError("--memory_limits takes sizes, not 'none'")
  try:
    check_args(args)
  except ValueError as e:
    raise app.UsageError(str(e)) from None
  return args
