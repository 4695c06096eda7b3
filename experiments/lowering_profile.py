"""The ``--profile`` part of ``experiments.lowering_bench`` (no flags here).

A worker process on 2 fake single-threaded CPU devices pinned to 2 cores
builds each (model, plan) on ``vshape(2)``, then profiles its step with
``experiments.step_profile`` (XLA's trace, split by the lowering's name
scopes). Models: the issue's MLP (4 layers of width 1024, 256 rows per
micro-batch), the README's GPT (embedding, 4 layers of width 64, tied
head; cut automatically into 2 blocks), a parameter-heavy MLP (4 layers
of width 1664, 11.1M parameters, 32 rows per micro-batch) and ResNet18
(``experiments.resnet``, 11.7M parameters, 4 images of 16 x 16 per
micro-batch, cut after stage 3 as in the placed part). A plan named
``<plan>_nohoist`` is lowered without hoisting the kernels' parameter-only
work out of the tick loop (``Switches(hoist=False)``, ``passes.switches``).
"""

from __future__ import annotations

import json
import os
import resource
import shutil
import subprocess
import sys
from collections.abc import Callable
from typing import Any

import jax
import numpy as np

import tessel_jax as tj
from experiments import host_pages
from experiments import lowering_bench_lib as lb
from experiments import resnet
from experiments import step_profile
from experiments import train_lib
from tessel_jax import placements
from tessel_jax.passes.switches import Switches

MODELS = ("mlp", "gpt", "wide", "resnet18")
PLANS = ("searched", "gpipe", "1f1b", "searched_nohoist", "gpipe_nohoist",
         "1f1b_nohoist")


def model(name: str, n: int) -> tuple[Callable, Any, Any, str]:
  """``(fn, params, batch, cut)`` of a profiled model, ``n`` micro-batches."""
  if name in ("mlp", "wide"):
    hidden, rows = (1024, 256) if name == "mlp" else (1664, 32)
    fn, params = lb.chain_model(2, hidden, 2)
    return fn, params, lb.make_batch(n * rows, hidden), "markers"
  if name == "gpt":
    vocab, d, layers, seq, rows = 64, 64, 4, 32, 8
    params = train_lib.init_params(jax.random.PRNGKey(0), vocab, d, layers,
                                   seq)
    fn = train_lib.make_loss_fn(2, layers, heads=4)
    rng = np.random.default_rng(0)
    tokens = rng.integers(0, vocab, (n * rows, seq + 1))
    batch = {"tokens": jax.numpy.asarray(tokens[:, :-1], jax.numpy.int32),
             "labels": jax.numpy.asarray(tokens[:, 1:], jax.numpy.int32)}
    return fn, params, batch, "auto"
  if name == "resnet18":
    fn = resnet.make_loss(tj.boundary, cut_after=(5,))
    return (fn, resnet.init(jax.random.PRNGKey(0)),
            resnet.batch(n * 4, image=16), "markers")
  raise ValueError(f"unknown profile model {name!r}; choose from {MODELS}")


def page_faults(run: Callable[[], Any], repeats: int) -> dict[str, Any]:
  """Median minor page faults and system CPU ms of an untraced step."""
  got = []
  for _ in range(max(repeats, 3)):
    r0 = resource.getrusage(resource.RUSAGE_SELF)
    jax.block_until_ready(run())
    r1 = resource.getrusage(resource.RUSAGE_SELF)
    got.append((r1.ru_minflt - r0.ru_minflt,
                1e3 * (r1.ru_stime - r0.ru_stime)))
  got.sort()
  return {"minor_faults": got[len(got) // 2][0],
          "sys_ms": round(sorted(g[1] for g in got)[len(got) // 2], 1)}


def worker(models: tuple[str, ...], plans: tuple[str, ...], n: int,
           cost: str, repeats: int) -> list[dict[str, Any]]:
  """Profiles every (model, plan) in this process (2 devices)."""
  mesh = jax.make_mesh((2,), ("pipe",),
                       axis_types=(jax.sharding.AxisType.Auto,))
  rows = []
  for m in models:
    fn, params, batch, cut = model(m, n)
    for p in plans:
      plan = p.removesuffix("_nohoist")
      step = tj.schedule(fn, mesh=mesh, placement=placements.vshape(2),
                         num_microbatches=n, cut=cut, cost=cost,
                         plan=None if plan == "searched" else plan,
                         switches=Switches(
                             hoist=not p.endswith("_nohoist")))
      built = step.build(params, batch)
      compiled = built.jitted.lower(params, batch).compile()
      run = lambda: compiled(params, batch)  # pylint: disable=cell-var-from-loop
      prof = step_profile.profile_step(run, compiled.as_text(), 2, repeats)
      row = {"model": m, "plan": p, "n": n,
             "lowered_as": built.plan.loop_summary(), **prof,
             **page_faults(run, repeats)}
      print(json.dumps({"profiled": row}), flush=True)
      rows.append(row)
  return rows


def part_profile(args: Any, log: Callable[[str], None]) -> dict[str, Any]:
  """Runs the worker pinned to 2 cores; the table of its profiles."""
  cmd = [sys.executable, "-m", "experiments.lowering_bench",
         "--worker=profile",
         f"--profile_models={','.join(args.profile_models)}",
         f"--profile_plans={','.join(args.profile_plans)}",
         f"--profile_n={args.profile_n}", f"--profile_cost={args.profile_cost}",
         f"--repeats={args.repeats}", "--output="]
  env = host_pages.env(args.keep_pages)
  env.pop("XLA_FLAGS", None)
  cores = sorted(os.sched_getaffinity(0))[:2]
  taskset = shutil.which("taskset")
  if taskset:
    cmd = [taskset, "-c", ",".join(map(str, cores)), *cmd]
  proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True, env=env)
  rows = []
  for line in proc.stdout:
    if line.startswith("{"):
      rows.append(json.loads(line)["profiled"])
      log(f"profile {rows[-1]}")
  if proc.wait() or not rows:
    raise RuntimeError(f"profile worker failed (exit {proc.returncode})")
  table = step_profile.markdown(rows) + "\n\n" + faults_markdown(rows)
  log(table)
  return {"rows": rows, "table": table, "cores": cores,
          "load_average": os.getloadavg()}


def faults_markdown(rows: list[dict[str, Any]]) -> str:
  """Minor page faults and system CPU ms of an untraced step per row
  (both devices together): the fresh pages of XLA's per-call buffers."""
  lines = ["| model | plan | minor faults per step | system CPU ms per step |",
           "|---|---|---|---|"]
  for r in rows:
    lines.append(f"| {r['model']} | {r['plan']} | {r.get('minor_faults', '-')}"
                 f" | {r.get('sys_ms', '-')} |")
  return "\n".join(lines)
