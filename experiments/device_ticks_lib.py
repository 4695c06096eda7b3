"""What a tick costs on one accelerator (no flags here).

See ``experiments.device_ticks``. Everything runs on ``jax.devices()[0]``
(a GPU where there is one, else one CPU device), in one process:

* ``tick_floor``: the tick machinery alone on a (8,)-float carry: a
  ``fori_loop`` of ``ticks`` iterations, the same loop with a
  ``lax.switch`` on a per-tick table (``branches`` tiny branches, as the
  compact lowering reads its tick table), and the same ops unrolled
  straight. Their difference per iteration is the loop's and the
  switch's own cost on this backend.
* ``steps``: the issue's MLP (``layers`` x ``tanh(h @ W + b)``, ``width``,
  ``rows`` per micro-batch, ``n`` micro-batches) trained one step by
  ``plain`` (``jax.value_and_grad`` over the whole batch), ``accumulate``
  (a ``lax.scan`` of ``value_and_grad`` over the micro-batches: the
  gradient accumulation a user writes) and ``tj_*``: ``tj.schedule`` on a
  one-device mesh with ``interleaved(1, chunks=layers)`` (every layer a
  block of that device: the lowered tick program with its switch, stash
  and accumulators, and no ppermute partner), compact and loop forms and
  the classic GPipe order in the platform's default form
  (``tessel_jax.ramps``). Every variant is timed once per round in
  shuffled order; medians and paired ratios to ``accumulate``. Per tick:
  ``(tj - accumulate) / ticks``.
* ``profile``: one ``cost="measured"`` build: the block profiles measured
  on this backend (``report.block_ms``), the per-tick overhead the cost
  model charges (``report.tick_overhead_ms``) and its predicted step
  against the step timed as above.

Each ``tj_*`` program is checked against ``plain`` (loss and gradients,
largest relative error) before it is timed.
"""

from __future__ import annotations

import os
import random
import statistics
import time
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

import tessel_jax as tj
from experiments import runs
from tessel_jax import placements


class TicksArgs(NamedTuple):
  """Everything ``device_ticks_lib`` needs; see the flags."""

  width: int = 1024
  rows: int = 256
  layers: int = 4
  ns: tuple[int, ...] = (8, 32)
  rounds: int = 7
  ticks: int = 256
  branches: int = 8
  profile: bool = True
  output: str | None = "results/device_ticks/device_ticks.json"


# --- timing -----------------------------------------------------------------


def _once_ms(run: Callable[[], Any]) -> float:
  """Wall milliseconds of one call, its outputs ready."""
  start = time.perf_counter()
  jax.block_until_ready(run())
  return (time.perf_counter() - start) * 1e3


def _interleaved(variants: dict[str, Callable[[], Any]], rounds: int,
                 seed: int = 0) -> dict[str, list[float]]:
  """Each variant once per round in shuffled order; ms per variant."""
  order = list(variants)
  times: dict[str, list[float]] = {name: [] for name in order}
  rng = random.Random(seed)
  for run in variants.values():  # warm: compiled, first-call work done
    _once_ms(run)
  for _ in range(rounds):
    rng.shuffle(order)
    for name in order:
      times[name].append(_once_ms(variants[name]))
  return times


def _paired_median(times: dict[str, list[float]], name: str,
                   base: str) -> float:
  """Median over rounds of ``times[name] / times[base]``."""
  return statistics.median(a / b for a, b in zip(times[name], times[base]))


# --- the tick floor ---------------------------------------------------------


def _tick_floor_programs(ticks: int, branches: int
                         ) -> dict[str, Callable[[], Any]]:
  """The loop, the loop with a switch, and the unrolled ops."""
  table = jnp.asarray(np.arange(ticks) % branches, jnp.int32)
  carry = jnp.ones((8,), jnp.float32)
  fns = [lambda c, k=k: c * 0.999 + k * 1e-3 for k in range(branches)]

  @jax.jit
  def loop(c):
    return lax.fori_loop(0, ticks, lambda t, c: fns[0](c), c)

  @jax.jit
  def switched(c, table):
    return lax.fori_loop(0, ticks,
                         lambda t, c: lax.switch(table[t], fns, c), c)

  @jax.jit
  def unrolled(c):
    for t in range(ticks):
      c = lax.optimization_barrier(fns[t % branches](c))
    return c

  return {"loop": lambda: loop(carry),
          "loop+switch": lambda: switched(carry, table),
          "unrolled": lambda: unrolled(carry)}


def tick_floor(args: TicksArgs) -> dict[str, Any]:
  """Microseconds per iteration of the loop, the switch and unrolled ops."""
  times = _interleaved(_tick_floor_programs(args.ticks, args.branches),
                       args.rounds)
  per_tick = {name: statistics.median(ms) * 1e3 / args.ticks
              for name, ms in times.items()}
  return {"ticks": args.ticks, "branches": args.branches,
          "us_per_iteration": per_tick,
          "switch_us": per_tick["loop+switch"] - per_tick["loop"]}


# --- the MLP step -----------------------------------------------------------


def mlp_loss(params: Sequence[dict[str, jax.Array]],
             batch: dict[str, jax.Array]) -> jax.Array:
  """The issue's MLP: ``tanh(h @ W + b)`` per layer, squared error."""
  h = batch["x"]
  for i, layer in enumerate(params):
    h = jnp.tanh(h @ layer["w"] + layer["b"])
    if i < len(params) - 1:
      h = tj.boundary(h)
  return jnp.mean((h - batch["y"]) ** 2)


def mlp_inputs(args: TicksArgs, n: int) -> tuple[Any, Any]:
  """Parameters and an ``n``-micro-batch batch of the MLP."""
  keys = jax.random.split(jax.random.key(0), args.layers + 2)
  scale = 1.0 / np.sqrt(args.width)
  params = [{"w": jax.random.normal(k, (args.width, args.width)) * scale,
             "b": jnp.zeros((args.width,))} for k in keys[:args.layers]]
  shape = (n * args.rows, args.width)
  batch = {"x": jax.random.normal(keys[-2], shape),
           "y": jax.random.normal(keys[-1], shape)}
  return params, batch


def _plain_programs(n: int) -> dict[str, Callable[..., Any]]:
  """``plain`` and ``accumulate``: what a user runs without a pipeline."""
  plain = jax.jit(jax.value_and_grad(mlp_loss))

  @jax.jit
  def accumulate(params, batch):
    mbs = jax.tree.map(lambda a: a.reshape(n, -1, *a.shape[1:]), batch)
    zero = (jnp.zeros(()), jax.tree.map(jnp.zeros_like, params))

    def body(acc, mb):
      loss, grads = jax.value_and_grad(mlp_loss)(params, mb)
      return jax.tree.map(jnp.add, acc, (loss, grads)), None

    (loss, grads), _ = lax.scan(body, zero, mbs)
    return jax.tree.map(lambda a: a / n, (loss, grads))

  return {"plain": plain, "accumulate": accumulate}


def _scheduled(args: TicksArgs, n: int, **options: Any) -> Any:
  """``tj.schedule`` of the MLP on a one-device mesh, every layer a block."""
  mesh = jax.sharding.Mesh(np.array(jax.devices()[:1]), ("pipe",))
  return tj.schedule(mlp_loss, mesh=mesh, num_microbatches=n,
                     placement=placements.interleaved(1, chunks=args.layers),
                     **options)


TJ_VARIANTS: dict[str, dict[str, Any]] = {
    "tj_compact": {"interpret_ramps": 0},
    "tj_loop": {"interpret_ramps": None},
    "tj_gpipe": {"plan": "gpipe"},
}


def _max_rel_err(got: Any, want: Any) -> float:
  """Largest relative error over the leaves of two equal pytrees."""
  errs = [float(jnp.max(jnp.abs(a - b)) / (jnp.max(jnp.abs(b)) + 1e-30))
          for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want))]
  return max(errs)


def _built(args: TicksArgs, n: int, params: Any, batch: Any
           ) -> tuple[dict[str, Callable[[], Any]], dict[str, Any]]:
  """Every variant's program (built, checked) and what its build says."""
  plain = _plain_programs(n)
  want = plain["plain"](params, batch)
  programs = {name: (lambda f=f: f(params, batch))
              for name, f in plain.items()}
  facts: dict[str, Any] = {}
  for name, options in TJ_VARIANTS.items():
    start = time.perf_counter()
    step = _scheduled(args, n, cost="uniform", **options)
    got = step(params, batch)
    facts[name] = {"first_call_s": time.perf_counter() - start,
                   "ticks": step.report.ticks,
                   "lowering": step.report.lowering,
                   "max_rel_err": _max_rel_err(got, want)}
    programs[name] = lambda step=step: step(params, batch)
  facts["accumulate"] = {"max_rel_err": _max_rel_err(
      programs["accumulate"](), want)}
  return programs, facts


def steps(args: TicksArgs, n: int) -> dict[str, Any]:
  """The MLP's step by every variant at ``n`` micro-batches."""
  params, batch = mlp_inputs(args, n)
  programs, facts = _built(args, n, params, batch)
  times = _interleaved(programs, args.rounds, seed=n)
  rows = {}
  for name, ms in times.items():
    row = {"median_ms": statistics.median(ms),
           "x_accumulate": _paired_median(times, name, "accumulate"),
           **facts.get(name, {})}
    if "ticks" in row:
      extra = row["median_ms"] - statistics.median(times["accumulate"])
      row["us_per_tick_over_accumulate"] = extra * 1e3 / row["ticks"]
    rows[name] = row
  return {"n": n, "variants": rows}


def profile(args: TicksArgs, n: int) -> dict[str, Any]:
  """One measured-cost build: block profiles and the predicted step."""
  params, batch = mlp_inputs(args, n)
  step = _scheduled(args, n, cost="measured")
  jax.block_until_ready(step(params, batch))
  times = _interleaved({"measured": lambda: step(params, batch)},
                       args.rounds)
  report = step.report
  return {"n": n, "block_ms": dict(report.block_ms),
          "tick_overhead_ms": report.tick_overhead_ms,
          "ticks": report.ticks, "lowering": report.lowering,
          "predicted_step_ms": report.predicted_step_ms,
          "measured_step_ms": statistics.median(times["measured"])}


# --- the runner -------------------------------------------------------------


def _print_steps(result: dict[str, Any]) -> None:
  """The tick floor and the step tables as Markdown."""
  floor = result["tick_floor"]
  print(f"device: {result['device']}  jax {result['jax']}")
  print(f"tick floor, us per iteration ({floor['ticks']} ticks,"
        f" {floor['branches']} branches):",
        {k: round(v, 2) for k, v in floor["us_per_iteration"].items()},
        f"switch {floor['switch_us']:.2f} us")
  for block in result["steps"]:
    print(f"\nN = {block['n']}\n| variant | median ms | x accumulate |"
          " ticks | us/tick over accumulate | first call s | max rel err |")
    print("|---|---|---|---|---|---|---|")
    for name, row in block["variants"].items():
      print(f"| {name} | {row['median_ms']:.3f} | {row['x_accumulate']:.3f}"
            f" | {row.get('ticks', '')} |"
            f" {row.get('us_per_tick_over_accumulate', float('nan')):.1f} |"
            f" {row.get('first_call_s', float('nan')):.2f} |"
            f" {row.get('max_rel_err', float('nan')):.1e} |")


def _print_profile(prof: dict[str, Any]) -> None:
  """The measured build's figures."""
  blocks = {k: round(v, 4) for k, v in prof["block_ms"].items()}
  print(f"\nmeasured build, N = {prof['n']}: blocks (ms) {blocks};"
        f" tick overhead {prof['tick_overhead_ms']} ms; predicted"
        f" {prof['predicted_step_ms']:.3f} ms, measured"
        f" {prof['measured_step_ms']:.3f} ms ({prof['lowering']})")


def main(args: TicksArgs) -> int:
  """Runs every part, prints the tables, writes the JSON."""
  device = jax.devices()[0]
  result: dict[str, Any] = {
      "device": f"{device.platform}: {device.device_kind}",
      "jax": jax.__version__, "xla_flags": os.environ.get("XLA_FLAGS", ""),
      "args": args._asdict(), "tick_floor": tick_floor(args),
      "steps": [steps(args, n) for n in args.ns]}
  _print_steps(result)
  if args.profile:
    result["profile"] = profile(args, args.ns[0])
    _print_profile(result["profile"])
  if args.output:
    runs.write(dict(result, output=args.output))
    print(f"\nwrote {args.output}")
  return 0
