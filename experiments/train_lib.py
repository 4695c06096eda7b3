"""A small character-level GPT trained with ``tj.schedule`` (no flags here).

``run(args)`` trains and returns the record; ``main(args)`` prints it and
writes the JSON and the schedule picture. The text is the source of a few
Python standard-library modules, read from the running interpreter.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

import tessel_jax as tj
from experiments import host_steal
from experiments.progress import Heartbeat
from tessel_jax import placements


class TrainArgs(NamedTuple):
  """Everything ``train_lib.run`` needs; see the flags for meanings."""

  placement: str = "mshape"
  devices: int = 4
  data: int = 1
  layers: int = 4
  d_model: int = 64
  heads: int = 4
  seq: int = 32
  microbatches: int = 16
  microbatch_size: int = 4
  steps: int = 30
  lr: float = 3e-3
  seed: int = 0
  schedule: str | None = None
  time_limit: float = 30.0
  check: bool = True
  plot: str | None = "out/train_schedule.png"
  output: str | None = "out/train.json"
  grid_steps: int = 48
  cost: str | None = None      # None: $TESSEL_JAX_COST, else "measured"
  reprofile: bool = False
  interpret_ramps: int | str | None = "auto"  # tj.schedule's default
  step_opt_level: int | None = None  # None: XLA's default (2)


# The runner lowers with ``interpret_ramps="auto"`` unless told otherwise,
# the compact lowering here (every tick in one table-driven loop, each
# kernel compiled once). Measured on the
# main job (README GPT, mshape(4), 16 micro-batches, cold caches, quiet
# 2-core machine, 2026-11-25): compile 11.5 s -> 4.1 s, first step at
# 23.1 s -> 14.8 s. Since remote messages wait in outboxes until due and
# each device writes only the messages its kernel made (``passes.held``,
# ``passes.local_writes``) the compact step costs what the default's does:
# 1.004-1.008x its wall time at 0.96-0.98x its CPU
# (``experiments.compact_bench --model=gpt``, paired, 2026-11-26; it was
# ~1.37x, when the rule was "below 150 steps").


def interpret_ramps_for(steps: int, given: int | None) -> int | str | None:
  """``tj.schedule``'s ``interpret_ramps`` for a run of ``steps`` steps.

  Args:
    steps: Training steps the run makes (the rule no longer depends on it).
    given: The ``--interpret_ramps`` flag (None: not given; negative:
      unroll every ramp).

  Returns:
    ``given`` when given (None for a negative one), else ``"auto"``
    (``tj.schedule``'s default: the compact lowering, 0).
  """
  del steps
  if given is not None:
    return None if given < 0 else given
  return "auto"


def step_compile_options(opt_level: int | None) -> dict[str, int] | None:
  """XLA compile options of the pipelined step (``Lowered.compile``'s
  argument): None keeps XLA's defaults; a level sets
  ``xla_backend_optimization_level`` (LLVM's -O level of the CPU code)."""
  if opt_level is None:
    return None
  return {"xla_backend_optimization_level": int(opt_level)}


# --- data -----------------------------------------------------------------

_MODULES = ("textwrap", "string", "functools", "heapq", "bisect", "fnmatch")


def corpus() -> str:
  """Source text of a few standard-library modules (about 100 KB)."""
  import importlib  # pylint: disable=import-outside-toplevel
  parts = []
  for name in _MODULES:
    mod = importlib.import_module(name)
    with open(mod.__file__, encoding="utf-8") as f:
      parts.append(f.read())
  return "\n".join(parts)


class CharData:
  """Random windows of the corpus as (tokens, labels) batches."""

  def __init__(self, text: str, seq: int, seed: int):
    chars = sorted(set(text))
    self.vocab = len(chars)
    index = {c: i for i, c in enumerate(chars)}
    self.ids = np.array([index[c] for c in text], np.int32)
    self.seq = seq
    self.rng = np.random.default_rng(seed)

  def batch(self, rows: int) -> dict[str, np.ndarray]:
    starts = self.rng.integers(0, len(self.ids) - self.seq - 1, rows)
    win = np.stack([self.ids[s:s + self.seq + 1] for s in starts])
    return {"tokens": win[:, :-1], "labels": win[:, 1:]}


# --- model ----------------------------------------------------------------


def init_params(key: Any, vocab: int, d: int, layers: int,
                seq: int) -> dict[str, Any]:
  """The GPT's first parameters, drawn by numpy from ``key`` (an int seed
  or a jax PRNG key; its bits seed the generator).

  Drawn on the host and then placed: ``jax.random`` here ran about 20
  small XLA programs (one per shape and operation), each compiled on its
  first call, and cost ~3 CPU seconds of a cold start of the main job.
  """
  words = ([(key >> 32) & 0xFFFFFFFF, key & 0xFFFFFFFF]  # as PRNGKey(key)
           if isinstance(key, int) else
           [int(x) for x in np.ravel(jax.random.key_data(key))])
  rng = np.random.default_rng(words)
  # jax.device_put, not jnp.asarray: that compiles a conversion per shape.
  normal = lambda shape, s: jax.device_put(
      (rng.standard_normal(shape, np.float32) * s).astype(np.float32))
  ones = lambda n: jax.device_put(np.ones((n,), np.float32))
  zeros = lambda n: jax.device_put(np.zeros((n,), np.float32))
  out = {"wte": normal((vocab, d), 0.05),
         "wpe": normal((seq, d), 0.02),
         "lnf": {"g": ones(d), "b": zeros(d)},
         "layers": []}
  for _ in range(layers):
    out["layers"].append({
        "ln1": {"g": ones(d), "b": zeros(d)},
        "qkv": normal((d, 3 * d), d ** -0.5),
        "proj": normal((d, d), (2 * d * layers) ** -0.5),
        "ln2": {"g": ones(d), "b": zeros(d)},
        "fc": normal((d, 4 * d), d ** -0.5),
        "fc_b": zeros(4 * d),
        "out": normal((4 * d, d), (8 * d * layers) ** -0.5),
        "out_b": zeros(d),
    })
  return out


def zeros_like_host(tree: Any) -> Any:
  """Zeros shaped as ``tree``'s leaves, made on the host and placed
  (``jnp.zeros_like`` compiles one XLA program per shape)."""
  return jax.tree_util.tree_map(
      lambda x: jax.device_put(np.zeros(x.shape, x.dtype)), tree)


def layer_norm(p: Any, x: Any) -> Any:
  """Layer norm with gain ``p['g']`` and bias ``p['b']``."""
  mu = x.mean(-1, keepdims=True)
  var = ((x - mu) ** 2).mean(-1, keepdims=True)
  return (x - mu) * jax.lax.rsqrt(var + 1e-5) * p["g"] + p["b"]


def transformer_layer(p: Any, x: Any, heads: int) -> Any:
  """One pre-norm causal self-attention + MLP block (GPT-2 style)."""
  b, s, d = x.shape
  q, k, v = jnp.split(layer_norm(p["ln1"], x) @ p["qkv"], 3, axis=-1)
  split = lambda t: t.reshape(b, s, heads, d // heads).transpose(0, 2, 1, 3)
  q, k, v = split(q), split(k), split(v)
  att = (q @ k.transpose(0, 1, 3, 2)) * (d // heads) ** -0.5
  mask = jnp.tril(jnp.ones((s, s), bool))
  att = jax.nn.softmax(jnp.where(mask, att, -1e9), axis=-1)
  y = (att @ v).transpose(0, 2, 1, 3).reshape(b, s, d)
  x = x + y @ p["proj"]
  h = jax.nn.gelu(layer_norm(p["ln2"], x) @ p["fc"] + p["fc_b"])
  return x + h @ p["out"] + p["out_b"]


def layer_groups(layers: int, num_blocks: int) -> list[list[int]]:
  """Layers of each block: block 0 is the embedding, the rest share layers."""
  if num_blocks < 2:
    raise ValueError("the GPT needs at least 2 blocks (embedding, head)")
  groups = np.array_split(np.arange(layers), num_blocks - 1)
  return [[]] + [list(map(int, g)) for g in groups]


def make_loss_fn(num_blocks: int, layers: int, heads: int):
  """``loss_fn(params, batch)`` with ``num_blocks - 1`` boundaries."""
  groups = layer_groups(layers, num_blocks)

  def gpt_loss(params, batch):
    tokens = batch["tokens"]
    x = params["wte"][tokens] + params["wpe"][None, :tokens.shape[1]]
    for block in range(1, num_blocks):
      x = tj.boundary(x)                       # ends block `block - 1`
      for i in groups[block]:
        x = transformer_layer(params["layers"][i], x, heads)
    logits = layer_norm(params["lnf"], x) @ params["wte"].T     # tied head
    logp = jax.nn.log_softmax(logits, axis=-1)
    nll = -jnp.take_along_axis(logp, batch["labels"][..., None], axis=-1)
    return nll.mean()

  return gpt_loss


# --- optimiser --------------------------------------------------------------


@jax.jit
def adam(params, grads, state, lr):
  m, v, t = state
  t = t + 1
  m = jax.tree_util.tree_map(lambda m, g: 0.9 * m + 0.1 * g, m, grads)
  v = jax.tree_util.tree_map(lambda v, g: 0.999 * v + 0.001 * g * g, v, grads)
  scale = lr * jnp.sqrt(1 - 0.999 ** t) / (1 - 0.9 ** t)
  params = jax.tree_util.tree_map(
      lambda p, m, v: p - scale * m / (jnp.sqrt(v) + 1e-8), params, m, v)
  return params, (m, v, t)


# --- run ------------------------------------------------------------------


class _Setup(NamedTuple):
  """What a run trains: the placement, the data, the first parameters and
  the scheduled step."""

  graph: Any
  data: "CharData"
  params: Any
  step: Any


def _setup(args: Any, log: Callable[[str], None]) -> _Setup:
  """Builds the model, the data, the mesh and ``tj.schedule``'s step."""
  graph = placements.get(args.placement, args.devices)
  num_blocks = sum(1 for b in graph.blocks if b.kind == "F")
  data = CharData(corpus(), args.seq, args.seed)
  params = init_params(args.seed, data.vocab,
                       args.d_model, args.layers, args.seq)
  loss_fn = make_loss_fn(num_blocks, args.layers, args.heads)
  if args.data > 1:
    mesh = jax.make_mesh((args.data, args.devices), ("data", "pipe"))
  else:
    mesh = jax.make_mesh((args.devices,), ("pipe",))
  step = tj.schedule(loss_fn, mesh=mesh, placement=graph,
                     num_microbatches=args.microbatches, plan=args.schedule,
                     solver_time_limit_s=args.time_limit, seed=args.seed,
                     cost=args.cost, reprofile=args.reprofile,
                     interpret_ramps=args.interpret_ramps,
                     optimizer_slots=2)  # Adam's m and v
  groups = layer_groups(args.layers, num_blocks)
  log(f"placement {graph.name}: {num_blocks} blocks, layers per block"
      f" {[len(g) for g in groups]} (block 0: embedding; head tied to it in"
      f" the last block)")
  log(f"vocab {data.vocab}, {sum(x.size for x in jax.tree_util.tree_leaves(params))}"
      f" parameters, {args.microbatches} micro-batches of"
      f" {args.microbatch_size} x {args.seq}")
  return _Setup(graph, data, params, step)


def _build(args: Any, setup: _Setup, batch: Any,
           log: Callable[[str], None]) -> tuple[Any, Any, dict[str, Any]]:
  """Builds and compiles the step, logs the schedule; returns the built
  step, the compiled program and the record's first fields."""
  log("building: tracing, measuring every block (cached for the next run)"
      " and searching the schedule ...")
  t0 = time.perf_counter()
  with Heartbeat("building", log):
    built = setup.step.build(setup.params, batch)
  build_s = time.perf_counter() - t0
  log(f"built in {build_s:.1f} s; compiling the pipelined step ...")
  t0 = time.perf_counter()
  with Heartbeat("compiling the pipelined step", log):
    compiled = setup.step.lower(setup.params, batch).compile(
        step_compile_options(args.step_opt_level))
  compile_s = time.perf_counter() - t0
  sched = built.schedule
  if sched is not None:
    log(f"searched repetend: period {sched.period}, offsets"
        f" {sched.repetend.offsets}, status {sched.status},"
        f" {sched.search_seconds:.2f} s")
  log(f"schedule ({built.unrolled.source}): makespan {built.unrolled.makespan},"
      f" lowered as {built.plan.loop_summary()} ticks;"
      f" build {build_s:.2f} s, compile {compile_s:.2f} s")
  log(built.unrolled.grid(max_steps=args.grid_steps or None))
  log(f"cost model: {built.report.summary()}")
  record: dict[str, Any] = {
      "placement": setup.graph.name, "devices": args.devices,
      "data": args.data, "microbatches": args.microbatches,
      "microbatch_size": args.microbatch_size, "layers": args.layers,
      "d_model": args.d_model, "period": built.unrolled.period,
      "makespan": built.unrolled.makespan, "source": built.unrolled.source,
      "loops": built.plan.loop_summary(), "build_seconds": round(build_s, 3),
      "compile_seconds": round(compile_s, 3), "losses": [],
      "step_seconds": [], "report": built.report.to_dict()}
  return built, compiled, record


def run(args: Any, log=print) -> dict[str, Any]:
  """Trains; returns the JSON record."""
  setup = _setup(args, log)
  rows = args.microbatches * args.microbatch_size
  batch0 = setup.data.batch(rows)  # built on; what step.verify checks
  built, compiled, record = _build(args, setup, batch0, log)
  params = setup.params
  state = (zeros_like_host(params), zeros_like_host(params), 0)
  record["step_cpu_seconds"] = []
  steal0 = host_steal.steal_seconds()
  for i in range(args.steps):
    batch = setup.data.batch(rows)
    t0, c0 = time.perf_counter(), time.process_time()
    with Heartbeat(f"step {i}", log):
      loss, grads = compiled(params, batch)
      loss = float(loss)
    dt = time.perf_counter() - t0
    record["losses"].append(round(loss, 5))
    record["step_seconds"].append(round(dt, 4))
    record["step_cpu_seconds"].append(round(time.process_time() - c0, 4))
    # Shown before the update: adam's first call compiles (~0.5 s).
    log(f"step {i:3d}  loss {loss:.4f}  ({dt * 1e3:.0f} ms)")
    params, state = adam(params, grads, state, args.lr)
    if i == 0 and args.check:  # after the first step, so it shows at once
      _check(setup.step, setup.params, batch0, record, log)
  steal1 = host_steal.steal_seconds()
  record["steal_seconds"] = (None if steal0 is None or steal1 is None else
                             round(steal1 - steal0, 2))
  if args.check and not args.steps:
    _check(setup.step, setup.params, batch0, record, log)
  _log_prediction(record, built.report, log)
  if args.plot:
    from tessel_jax import plot  # pylint: disable=import-outside-toplevel
    os.makedirs(os.path.dirname(args.plot) or ".", exist_ok=True)
    plot.gantt(built.unrolled, args.plot)
    record["plot"] = args.plot
    log(f"schedule picture: {args.plot}")
  return record


def _check(step: Any, params: Any, batch: Any, record: dict[str, Any],
           log: Callable[[str], None]) -> None:
  """``step.verify`` on the first parameters and batch (the program against
  ``jax.value_and_grad``), logged and recorded."""
  with Heartbeat("checking the program against jax.value_and_grad", log):
    check = step.verify(params, batch)
  grads_rel = [l.max_rel for l in check.leaves if l.path != "[0]"]
  record["check_loss_rel_err"] = check.leaves[0].max_rel
  record["check_grad_rel_err"] = max(grads_rel, default=0.0)
  record["check_ok"] = check.ok
  record["check_first_bad_block"] = check.first_bad_block
  log(f"step 0 vs jax.value_and_grad (step.verify): loss rel err"
      f" {record['check_loss_rel_err']:.2e}, grad rel err"
      f" {record['check_grad_rel_err']:.2e}"
      + ("" if check.ok else "\n" + str(check)))


def _log_prediction(record: dict[str, Any], report: Any, log) -> None:
  """Predicted against measured step time (median of the steps after the
  first, which may still pay one-time costs)."""
  times = record["step_seconds"][1:] or record["step_seconds"]
  if not times:
    return
  measured_ms = float(np.median(times)) * 1e3
  record["measured_step_ms"] = round(measured_ms, 3)
  log(_step_clocks(record))
  predicted = report.predicted_step_ms
  if predicted is None:
    log(f"step time: measured {measured_ms:.1f} ms (median); no prediction"
        f" with cost={report.cost!r}")
    return
  record["predicted_step_ms"] = round(predicted, 3)
  record["predicted_over_measured"] = round(predicted / measured_ms, 3)
  log(f"step time: predicted {predicted:.1f} ms, measured {measured_ms:.1f}"
      f" ms (median), ratio {predicted / measured_ms:.2f}")


def _step_clocks(record: dict[str, Any]) -> str:
  """The steps' process CPU and the host's steal during them: a step
  slower by the wall clock only (CPU per step unchanged, or steal) was
  disturbed, not a slower program (``experiments.host_steal``)."""
  cpu = record.get("step_cpu_seconds", [])[1:]
  if not cpu:
    return "step clocks: no process CPU recorded"
  record["measured_step_cpu_ms"] = round(float(np.median(cpu)) * 1e3, 3)
  steal = record.get("steal_seconds")
  return (f"step clocks: process CPU {record['measured_step_cpu_ms']:.1f} ms"
          f" per step (median, all threads); host steal during the steps"
          f" {'n/a' if steal is None else f'{steal:.2f} s'}")


def main(args: Any) -> int:
  record = run(args)
  if args.output:
    os.makedirs(os.path.dirname(args.output) or ".", exist_ok=True)
    with open(args.output, "w") as f:
      json.dump(record, f, indent=1)
    print(f"results: {args.output}")
  losses = record["losses"]
  if len(losses) >= 2 and not losses[-1] < losses[0]:
    print("loss did not fall")
    return 1
  return 0
