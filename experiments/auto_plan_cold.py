"""One cold ``placement="auto"`` choice on the README GPT, then warm ones.

  python -m experiments.auto_plan_cold --cost=measured
  python -m experiments.auto_plan_cold --cost=calibrated --memory_limit=6MiB

Builds ``tj.schedule(fn, placement="auto", num_microbatches=8, ...)`` on a
fresh measurement and schedule cache (4 fake CPU devices; vshape,
interleaved, mshape, mllm, zbv; CP-SAT 5 s; 2 optimizer slots) and prints
one JSON line: wall and process CPU seconds of the choice, load average,
the plan chosen and its prediction, whether the cache was cold and the
stand-in programs timed into it (``cost="calibrated"``). Then
(``--warm_runs``, default 1) runs itself again in new processes on the
same cache: the warm choice of a user's second run (profiles, stand-ins,
schedules and the priced frontier read from disk). Run it once per code
version compared, alternating them (a second choice in one process would
reuse the priced plans in memory).
"""

import json
import os
import subprocess
import sys
import tempfile
import time
from typing import Any

from absl import flags

from experiments import cli

flags.DEFINE_enum("cost", "measured", ["measured", "calibrated"],
                  "tj.schedule cost= option.")
flags.DEFINE_string("memory_limit", "none",
                    "Bytes per device: none, 6MiB, 512KiB, 123 ...")
flags.DEFINE_list("placements", ["vshape", "interleaved", "mshape", "mllm",
                                 "zbv"], "Placements tried.")
flags.DEFINE_string("cache_dir", None,
                    "Measurement and schedule cache (default: a fresh"
                    " temporary directory, so the first choice is cold).")
flags.DEFINE_integer("compile_workers", None,
                     "Kernels compiled at once (tessel_jax.cost.compile_pool"
                     ".WORKERS; default: the module's).")
flags.DEFINE_integer("compile_ahead", None,
                     "Kernels lowered and compiled (pipelined) before the"
                     " first of them is timed (tessel_jax.cost.compile_pool"
                     ".AHEAD; default: the module's).")
flags.DEFINE_bool("speculate", None,
                  "Compile the kernels of screened plans close to the best on"
                  " a background thread during the screening"
                  " (tessel_jax.cost.compile_pool.SPECULATE; default: the"
                  " module's).")
flags.DEFINE_integer("warm_runs", 1,
                     "Choices made after the first, each in a new process"
                     " on the same cache (warm).")


def main(argv: list[str]) -> None:
  cli.no_arguments(argv)
  f = flags.FLAGS
  cli.at_least(0, "warm_runs")
  if f.compile_workers is not None:
    cli.at_least(1, "compile_workers")
  if f.compile_ahead is not None:
    cli.at_least(1, "compile_ahead")
  cache = f.cache_dir or tempfile.mkdtemp(prefix="auto_plan_cold_")
  env = dict(os.environ)  # as the user started it: choose() adds XLA flags
  workers = ([] if f.compile_workers is None else
             [f"--compile_workers={f.compile_workers}"])
  workers += ([] if f.compile_ahead is None else
              [f"--compile_ahead={f.compile_ahead}"])
  workers += ([] if f.speculate is None else
              [f"--speculate={f.speculate}"])
  choose(f.cost, f.memory_limit, tuple(f.placements), cache,
         f.compile_workers, f.compile_ahead, f.speculate)
  for _ in range(f.warm_runs):
    subprocess.run([sys.executable, "-m", "experiments.auto_plan_cold",
                    f"--cost={f.cost}", f"--memory_limit={f.memory_limit}",
                    f"--placements={','.join(f.placements)}",
                    f"--cache_dir={cache}", "--warm_runs=0"] + workers,
                   check=True, env=env)
  sys.exit(0)


def choose(cost: str, memory_limit: str, placements: tuple[str, ...],
           cache: str, compile_workers: int | None = None,
           compile_ahead: int | None = None,
           speculate: bool | None = None) -> None:
  """One choice on ``cache`` in this process; prints its JSON line
  (``compile_workers``, ``compile_ahead``, ``speculate``: set
  ``compile_pool.WORKERS``, ``compile_pool.AHEAD``,
  ``compile_pool.SPECULATE``)."""
  cold = not os.path.isdir(cache) or not os.listdir(cache)
  from experiments import xla_env  # pylint: disable=import-outside-toplevel
  xla_env.add_xla_flags(xla_env.cpu_flags(4))
  import jax  # pylint: disable=import-outside-toplevel
  import tessel_jax as tj  # pylint: disable=import-outside-toplevel
  from experiments import auto_plan_lib as apl  # pylint: disable=import-outside-toplevel
  from tessel_jax import plans  # pylint: disable=import-outside-toplevel
  from tessel_jax.cost import compile_pool  # pylint: disable=import-outside-toplevel
  if compile_workers is not None:
    compile_pool.WORKERS = compile_workers
  if compile_ahead is not None:
    compile_pool.AHEAD = compile_ahead
  if speculate is not None:
    compile_pool.SPECULATE = speculate
  args = apl.AutoPlanArgs(placements=placements, time_limit=5)
  fn, params, batch, has_aux = apl.program(args)
  plans.DEFAULT_PLACEMENTS = args.placements
  step = tj.schedule(fn, mesh=jax.make_mesh((4,), ("pipe",)),
                     placement="auto", num_microbatches=args.microbatches,
                     memory_limit=apl.parse_limit(memory_limit),
                     cache_dir=cache, solver_time_limit_s=args.time_limit,
                     cost=cost, optimizer_slots=2, has_aux=has_aux)
  load0 = os.getloadavg()[0]
  t0, c0 = time.perf_counter(), time.process_time()
  step.build(params, batch)
  wall, cpu = time.perf_counter() - t0, time.process_time() - c0
  model = step.choice.step._costs  # pylint: disable=protected-access
  print(json.dumps({
      "cost": cost, "memory_limit": memory_limit, "cache": (
          "cold" if cold else "warm"), "wall_s": round(wall, 2),
      "cpu_s": round(cpu, 2), "load": [load0, os.getloadavg()[0]],
      "compile_workers": compile_pool.WORKERS,
      "compile_ahead": compile_pool.AHEAD,
      "speculate": compile_pool.SPECULATE,
      "background_compiled": compile_pool.BACKGROUND.submitted,
      "background_taken": compile_pool.BACKGROUND.taken,
      "runner_up": (None if step.choice.runner_up is None else
                    [step.choice.runner_up.label,
                     round(step.choice.runner_up.step, 3)]),
      "chose": step.choice.winner.label,
      "predicted_ms": round(step.choice.winner.step, 3),
      "plans": len(step.choice.frontier.plans),
      "full_builds": full_builds(step.choice.frontier),
      "pruned": sum(1 for _, why in step.choice.frontier.skipped
                    if why.startswith("Pruned")),
      "screen_prune": _screen_prune(),
      "screen_time_limit_s": _screen_budget(),
      "standins_on_disk": standins(cache),
      "standins_skipped": {  # bounded / uniform-span schedules estimated
          "bound": model.standins_skipped,
          "uniform_spans": model.alt_standins_skipped}}), flush=True)


def full_builds(frontier: Any) -> list[str]:
  """Searched plans of ``frontier`` priced by a full build (the rest were
  only screened): which ones moves a cold choice's CPU most."""
  return [p.label for p in frontier.plans
          if not p.screened and p.candidate.plan is None]


def _screen_prune() -> bool:
  """``tessel_jax.auto.SCREEN_PRUNE`` (``TESSEL_JAX_SCREEN_PRUNE=0``: off)."""
  from tessel_jax import auto  # pylint: disable=import-outside-toplevel
  return auto.SCREEN_PRUNE


def _screen_budget() -> float:
  """``tessel_jax.auto.SCREEN_TIME_LIMIT_S``
  (``TESSEL_JAX_SCREEN_TIME_LIMIT_S`` sets it)."""
  from tessel_jax import auto  # pylint: disable=import-outside-toplevel
  return auto.SCREEN_TIME_LIMIT_S


def standins(cache: str) -> int:
  """Stand-in programs timed into ``cache`` so far (``cost.calibrate``)."""
  return sum(1 for _, _, files in os.walk(cache) for name in files
             if name.startswith("standin-"))


if __name__ == "__main__":
  cli.run(main)
