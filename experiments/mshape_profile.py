"""Where the 4-stage mshape and zbv programs of ``peer_bench`` spend a step.

Usage (4 fake devices)::

  python -m experiments.mshape_profile --n=8 --repeats=3

Builds ``peer_bench``'s ``tj_mshape`` and ``tj_zbv`` (8 layers of width
1024, 256 rows per micro-batch) in one process and splits one step of each
by part (``experiments.step_profile``), alternating the two per round.
Prints one JSON line per variant and a markdown table.
"""

from __future__ import annotations

import json
import os
import resource

from absl import app, flags

from experiments import cli, xla_env

flags.DEFINE_integer("n", 8, "Micro-batches per step.")
flags.DEFINE_integer("repeats", 3, "Profiled steps per variant.")


def _cpu_s() -> float:
  """This process's user + system CPU seconds."""
  r = resource.getrusage(resource.RUSAGE_SELF)
  return r.ru_utime + r.ru_stime


def profile(n: int = 8, repeats: int = 3,
            variants: tuple[str, ...] = ("tj_mshape", "tj_zbv")) -> None:
  """Profiles ``variants`` at ``n`` micro-batches; prints the table."""
  # pylint: disable=import-outside-toplevel
  import jax

  import tessel_jax as tj
  from experiments import lowering_bench_lib as lb
  from experiments import peer_bench_lib as pbl
  from experiments import peer_gpipe as pg
  from experiments import step_profile
  params = pg.mlp_params(8, 1024, 0)
  batch = lb.make_batch(n * 256, 1024, 1)
  mesh = jax.make_mesh((4,), ("pipe",),
                       axis_types=(jax.sharding.AxisType.Auto,))
  runs = {}
  for name in variants:
    placement, blocks = pbl.tj_layout(name, 8, 4)
    step = tj.schedule(pbl.marked_loss(blocks), mesh=mesh,
                       placement=placement, num_microbatches=n,
                       cut="markers")
    built = step.build(params, batch)
    compiled = built.jitted.lower(params, batch).compile()
    runs[name] = (compiled, built.plan.loop_summary())
  rows = []
  for name, (compiled, summary) in runs.items():
    c0 = _cpu_s()
    prof = step_profile.profile_step(lambda c=compiled: c(params, batch),
                                     compiled.as_text(), 4, repeats)
    cpu = (_cpu_s() - c0) / (repeats + 1)
    row = {"model": "mlp8", "plan": name, "n": n, "lowered_as": summary,
           "cpu_ms_per_step": round(1e3 * cpu, 1), **prof}
    print(json.dumps({"profiled": row}), flush=True)
    rows.append(row)
  print(step_profile.markdown(rows))
  print("load", os.getloadavg())


def main(argv: list[str]) -> None:
  """The binary: 4 fake CPU devices, then :func:`main` on the flags."""
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {argv[1:]}")
  xla_env.add_xla_flags(xla_env.cpu_flags(4))
  profile(flags.FLAGS.n, flags.FLAGS.repeats)


if __name__ == "__main__":
  cli.run(main)
