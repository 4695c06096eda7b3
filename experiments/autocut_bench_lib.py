"""The automatic-cut benchmark (no flags here); see ``experiments.autocut_bench``.

For small unmarked models (a plain-JAX GPT, and Flax nnx / Equinox GPTs when
those libraries are importable) and each number of forward blocks ``K``:

1. cut with ``passes.autocut.cut_to`` (measured or analytic costs), timing
   the cut;
2. split the equations into contiguous groups (``--groups`` distinct ones,
   aligned to the repeated layers), time each group alone (forward +
   backward) and find the contiguous cut on group boundaries whose busiest
   block is smallest under those group times: by enumerating every cut
   (when there are at most ``ENUMERATE_LIMIT``), else by the exact min-max
   DP;
3. compile and time every block of both cuts alone (forward + backward, the
   fastest of interleaved rounds) and report the ratio of the busiest
   blocks' measured times, DP cut / best group cut (target <= 1.10; below 1
   when the DP's finer cut points beat the group boundaries);
4. report the DP cut's busiest block over ``C*`` under its own costs (at
   most ``1 + tolerance``: the slack spent on fewer live bytes).

The models also serve the tests (``tests/test_autocut.py``).
"""

from __future__ import annotations

import json
import math
import os
import time
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from experiments import train_lib
from tessel_jax.passes import autocut, autocut_cost, cut_dp
from tessel_jax.passes import tracing as _tracing

MODELS = ("plain", "flax", "equinox")


class BenchArgs(NamedTuple):
  """Everything the benchmark needs; see the flags for meanings."""

  models: tuple[str, ...] = MODELS
  blocks: tuple[int, ...] = (4, 8)
  layers: int = 6
  d_model: int = 128
  heads: int = 4
  vocab: int = 512
  seq: int = 64
  rows: int = 8
  groups: int = 24
  cost: str = "measured"
  repeats: int = 20
  single_thread: bool = True
  gpt12: bool = True
  output: str | None = "out/autocut_bench.json"


class Model(NamedTuple):
  """An unmarked step function and example inputs (one micro-batch)."""

  name: str
  fn: Callable[[Any, Any], Any]
  params: Any
  batch: Any


# --- models -------------------------------------------------------------------


def _batch(rows: int, seq: int, vocab: int, seed: int = 1) -> dict[str, Any]:
  rng = np.random.default_rng(seed)
  return {"tokens": jnp.asarray(rng.integers(0, vocab, (rows, seq)), jnp.int32),
          "labels": jnp.asarray(rng.integers(0, vocab, (rows, seq)), jnp.int32)}


def plain_gpt(layers: int = 4, d_model: int = 32, heads: int = 4,
              vocab: int = 64, seq: int = 16, rows: int = 4,
              seed: int = 0) -> Model:
  """A GPT in plain JAX (dict parameters), no tj.boundary."""
  keys = jax.random.split(jax.random.PRNGKey(seed), 2 + 4 * layers)
  d = d_model
  normal = lambda k, shape, s: jax.random.normal(k, shape, jnp.float32) * s
  params = {"wte": normal(keys[0], (vocab, d), 0.05),
            "wpe": normal(keys[1], (seq, d), 0.02),
            "lnf": {"g": jnp.ones((d,)), "b": jnp.zeros((d,))},
            "layers": []}
  for i in range(layers):
    k = keys[2 + 4 * i: 6 + 4 * i]
    params["layers"].append({
        "ln1": {"g": jnp.ones((d,)), "b": jnp.zeros((d,))},
        "qkv": normal(k[0], (d, 3 * d), d ** -0.5),
        "proj": normal(k[1], (d, d), (2 * d * layers) ** -0.5),
        "ln2": {"g": jnp.ones((d,)), "b": jnp.zeros((d,))},
        "fc": normal(k[2], (d, 4 * d), d ** -0.5),
        "fc_b": jnp.zeros((4 * d,)),
        "out": normal(k[3], (4 * d, d), (8 * d * layers) ** -0.5),
        "out_b": jnp.zeros((d,)),
    })

  def plain_gpt_loss(p: Any, batch: Any) -> Any:
    tokens = batch["tokens"]
    x = p["wte"][tokens] + p["wpe"][None, :tokens.shape[1]]
    for lp in p["layers"]:
      x = train_lib.transformer_layer(lp, x, heads)
    logits = train_lib.layer_norm(p["lnf"], x) @ p["wte"].T
    logp = jax.nn.log_softmax(logits, axis=-1)
    return -jnp.take_along_axis(logp, batch["labels"][..., None],
                                axis=-1).mean()

  return Model("plain", plain_gpt_loss, params, _batch(rows, seq, vocab))


def flax_gpt(layers: int = 4, d_model: int = 32, heads: int = 4,
             vocab: int = 64, seq: int = 16, rows: int = 4,
             seed: int = 0) -> Model:
  """A GPT written with ``flax.nnx`` modules; params = ``nnx.split`` state."""
  from flax import nnx  # pylint: disable=import-outside-toplevel

  class Layer(nnx.Module):
    def __init__(self, rngs: Any):
      self.ln1 = nnx.LayerNorm(d_model, rngs=rngs)
      self.att = nnx.MultiHeadAttention(
          num_heads=heads, in_features=d_model, qkv_features=d_model,
          decode=False, rngs=rngs)
      self.ln2 = nnx.LayerNorm(d_model, rngs=rngs)
      self.fc = nnx.Linear(d_model, 4 * d_model, rngs=rngs)
      self.out = nnx.Linear(4 * d_model, d_model, rngs=rngs)

    def __call__(self, x: Any) -> Any:
      s = x.shape[1]
      mask = nnx.make_causal_mask(jnp.ones((x.shape[0], s), jnp.int32))
      x = x + self.att(self.ln1(x), mask=mask)
      return x + self.out(jax.nn.gelu(self.fc(self.ln2(x))))

  class GPT(nnx.Module):
    def __init__(self, rngs: Any):
      self.wte = nnx.Embed(vocab, d_model, rngs=rngs)
      self.wpe = nnx.Embed(seq, d_model, rngs=rngs)
      self.layers = nnx.List([Layer(rngs) for _ in range(layers)])
      self.lnf = nnx.LayerNorm(d_model, rngs=rngs)

    def __call__(self, tokens: Any) -> Any:
      x = self.wte(tokens) + self.wpe(jnp.arange(tokens.shape[1]))[None]
      for layer in self.layers:
        x = layer(x)
      return self.wte.attend(self.lnf(x))

  graphdef, state = nnx.split(GPT(nnx.Rngs(seed)))

  def flax_gpt_loss(state: Any, batch: Any) -> Any:
    logits = nnx.merge(graphdef, state)(batch["tokens"])
    logp = jax.nn.log_softmax(logits, axis=-1)
    return -jnp.take_along_axis(logp, batch["labels"][..., None],
                                axis=-1).mean()

  return Model("flax", flax_gpt_loss, state, _batch(rows, seq, vocab))


def equinox_gpt(layers: int = 4, d_model: int = 32, heads: int = 4,
                vocab: int = 64, seq: int = 16, rows: int = 4,
                seed: int = 0) -> Model:
  """A GPT written with ``equinox.nn``; params = the arrays of the module."""
  import equinox as eqx  # pylint: disable=import-outside-toplevel

  class Layer(eqx.Module):
    ln1: Any
    att: Any
    ln2: Any
    mlp: Any

    def __init__(self, key: Any):
      k1, k2 = jax.random.split(key)
      self.ln1 = eqx.nn.LayerNorm(d_model)
      self.att = eqx.nn.MultiheadAttention(heads, d_model, key=k1)
      self.ln2 = eqx.nn.LayerNorm(d_model)
      self.mlp = eqx.nn.MLP(d_model, d_model, 4 * d_model, 1,
                            activation=jax.nn.gelu, key=k2)

    def __call__(self, x: Any) -> Any:  # one sequence (seq, d)
      y = jax.vmap(self.ln1)(x)
      mask = jnp.tril(jnp.ones((x.shape[0], x.shape[0]), bool))
      x = x + self.att(y, y, y, mask=mask)
      return x + jax.vmap(self.mlp)(jax.vmap(self.ln2)(x))

  class GPT(eqx.Module):
    wte: Any
    wpe: Any
    layers: list
    lnf: Any

    def __init__(self, key: Any):
      keys = jax.random.split(key, layers + 2)
      self.wte = eqx.nn.Embedding(vocab, d_model, key=keys[0])
      self.wpe = eqx.nn.Embedding(seq, d_model, key=keys[1])
      self.layers = [Layer(k) for k in keys[2:]]
      self.lnf = eqx.nn.LayerNorm(d_model)

    def __call__(self, tokens: Any) -> Any:  # one sequence
      x = jax.vmap(self.wte)(tokens) + jax.vmap(self.wpe)(
          jnp.arange(tokens.shape[0]))
      for layer in self.layers:
        x = layer(x)
      return jax.vmap(self.lnf)(x) @ self.wte.weight.T

  model = GPT(jax.random.PRNGKey(seed))
  params, static = eqx.partition(model, eqx.is_array)

  def equinox_gpt_loss(params: Any, batch: Any) -> Any:
    logits = jax.vmap(eqx.combine(params, static))(batch["tokens"])
    logp = jax.nn.log_softmax(logits, axis=-1)
    return -jnp.take_along_axis(logp, batch["labels"][..., None],
                                axis=-1).mean()

  return Model("equinox", equinox_gpt_loss, params, _batch(rows, seq, vocab))


BUILDERS = {"plain": plain_gpt, "flax": flax_gpt, "equinox": equinox_gpt}


def available(name: str) -> bool:
  """Whether the library behind model ``name`` is importable."""
  lib = {"flax": "flax", "equinox": "equinox"}.get(name)
  if lib is None:
    return True
  try:
    __import__(lib)
  except ImportError:
    return False
  return True


def trace(model: Model) -> Any:
  """``tracing.trace`` of the model on its batch."""
  return _tracing.trace(model.fn, model.name, model.params, model.batch)


# --- timing blocks ------------------------------------------------------------


def _blocks(positions: Sequence[int], n: int) -> list[tuple[int, int]]:
  bounds = [0, *positions, n]
  return list(zip(bounds, bounds[1:]))


ENUMERATE_LIMIT = 200_000  # contiguous cuts enumerated one by one up to this


def best_group_cut(group_times: Sequence[float],
                   bounds: Sequence[tuple[int, int]],
                   num_blocks: int) -> tuple[tuple[int, ...], float, str]:
  """Best contiguous cut on group boundaries under additive group times.

  Enumerates every cut when there are at most ``ENUMERATE_LIMIT`` of them;
  otherwise solves the same problem exactly with the min-max DP (checked
  against enumeration in the tests).

  Returns:
    ``(equation positions, predicted busiest seconds, method)``.
  """
  g = len(group_times)
  starts = [a for a, _ in bounds]
  if math.comb(g - 1, num_blocks - 1) <= ENUMERATE_LIMIT:
    pos, best = cut_dp.brute_force_cuts(group_times, num_blocks)
    method = "enumerated"
  else:
    pos, best = cut_dp.optimal_cuts(group_times, np.zeros(g + 1),
                                     num_blocks, tolerance=0.0)
    method = "exact DP"
  return tuple(starts[p] for p in pos), best, method


class _Timer:
  """Times equation ranges of one flattened jaxpr.

  Ranges are compiled once; :meth:`measure` runs every pending range once
  per round, round after round, and keeps each range's fastest run, so
  load from other processes hits all ranges alike.
  """

  def __init__(self, flat: Any, repeats: int):
    self.flat = flat
    self.repeats = repeats
    self.fns: dict[tuple[int, int], tuple[Any, list[Any]]] = {}
    self.best: dict[tuple[int, int], float] = {}

  def measure(self, ranges: Sequence[tuple[int, int]]) -> list[float]:
    todo = [r for r in dict.fromkeys(ranges) if r not in self.best]
    for r in todo:
      seg = autocut_cost.segment(self.flat, *r, train=True)
      jax.block_until_ready(seg.fn(*seg.args))  # compile + warm-up
      self.fns[r] = (seg.fn, seg.args)
      self.best[r] = np.inf
    for _ in range(self.repeats):
      for r in todo:
        fn, args = self.fns[r]
        t0 = time.perf_counter()
        jax.block_until_ready(fn(*args))
        self.best[r] = min(self.best[r], time.perf_counter() - t0)
    for r in todo:
      del self.fns[r]
    return [self.best[r] for r in ranges]


def bench_model(model: Model, args: BenchArgs,
                log: Callable[[str], None] = print) -> list[dict[str, Any]]:
  """Every K for one model: DP cut vs the best contiguous cut, measured."""
  traced = trace(model)
  flat = autocut.flatten(traced)
  eqns = flat.jaxpr.eqns
  n = len(eqns)
  live = autocut.live_bytes(flat)
  timer = _Timer(flat, args.repeats)
  est = autocut_cost.roofline_seconds(autocut_cost.analytic_costs(eqns),
                                      train=True)
  bounds = autocut_cost.group_bounds(eqns, est, args.groups)
  # Identical layers give identical groups: time each distinct one once.
  keys = [autocut_cost.segment(flat, a, b).key for a, b in bounds]
  first = {}
  for key, ab in zip(keys, bounds):
    first.setdefault(key, ab)
  distinct = dict(zip(first, timer.measure(list(first.values()))))
  group_times = [distinct[key] for key in keys]
  log(f"{model.name}: {n} equations, {len(bounds)} groups"
      f" ({len(distinct)} distinct) timed")
  rows = []
  for k in args.blocks:
    t0 = time.perf_counter()
    cut = autocut.cut_to(traced, k, cost=args.cost, cut="auto")
    cut_seconds = time.perf_counter() - t0
    info = autocut.cut_info(cut)
    ex_pos, ex_pred, method = best_group_cut(group_times, bounds, k)
    dp_ranges = _blocks(info.positions, n)
    ex_ranges = _blocks(ex_pos, n)
    times = timer.measure(dp_ranges + ex_ranges)
    dp_blocks, ex_blocks = times[:len(dp_ranges)], times[len(dp_ranges):]
    ratio = max(dp_blocks) / max(ex_blocks)
    row = {
        "model": model.name, "blocks": k, "eqns": n,
        "cost": info.cost_source, "cut_seconds": cut_seconds,
        "dp_positions": list(info.positions),
        "best_positions": list(ex_pos), "best_method": method,
        "best_predicted_ms": 1e3 * ex_pred,
        "dp_block_ms": [1e3 * t for t in dp_blocks],
        "best_block_ms": [1e3 * t for t in ex_blocks],
        "dp_max_ms": 1e3 * max(dp_blocks),
        "best_max_ms": 1e3 * max(ex_blocks),
        "ratio": ratio,
        "dp_vs_own_optimum": info.max_cost / info.best_max_cost
                             if info.best_max_cost else 1.0,
        "dp_cut_bytes": list(info.cut_bytes),
        "best_cut_bytes": [int(live[p]) for p in ex_pos],
        "groups": len(bounds),
    }
    log(f"{model.name:8s} K={k:2d} cut {cut_seconds:6.2f} s  busiest block"
        f" DP {row['dp_max_ms']:.3f} ms / best {row['best_max_ms']:.3f} ms"
        f" = {ratio:.3f}")
    rows.append(row)
  return rows


def gpt12_cut_time(args: BenchArgs) -> dict[str, Any]:
  """Cut time of a 12-layer small GPT (measured costs, cold then cached)."""
  model = plain_gpt(layers=12, d_model=64, heads=4, vocab=96, seq=32, rows=4)
  traced = trace(model)
  out = {}
  for label in ("cold", "warm"):
    t0 = time.perf_counter()
    autocut.cut_to(traced, 8, cost=args.cost, cut="auto")
    out[label] = time.perf_counter() - t0
  out["eqns"] = len(autocut.flatten(traced).jaxpr.eqns)
  return out


def run(args: BenchArgs, log: Callable[[str], None] = print) -> dict[str, Any]:
  """Runs every case; returns the JSON record."""
  rows = []
  skipped = []
  for name in args.models:
    if not available(name):
      skipped.append(name)
      log(f"{name}: not importable, skipped")
      continue
    model = BUILDERS[name](layers=args.layers, d_model=args.d_model,
                           heads=args.heads, vocab=args.vocab, seq=args.seq,
                           rows=args.rows)
    rows.extend(bench_model(model, args, log))
  record: dict[str, Any] = {"args": args._asdict(), "cases": rows,
                            "skipped": skipped,
                            "devices": str(jax.devices()[0].device_kind),
                            "xla_flags": os.environ.get("XLA_FLAGS", "")}
  if args.gpt12:
    record["gpt12_cut_seconds"] = gpt12_cut_time(args)
  return record


def table(record: dict[str, Any]) -> str:
  """The printed summary."""
  lines = ["model    K  eqns  cut s   DP max ms  best max ms  ratio"
           "  DP/own opt",
           "-" * 68]
  for r in record["cases"]:
    lines.append(f"{r['model']:8s} {r['blocks']:2d} {r['eqns']:5d} "
                 f"{r['cut_seconds']:6.2f} {r['dp_max_ms']:10.3f}"
                 f" {r['best_max_ms']:12.3f} {r['ratio']:6.3f}"
                 f" {r['dp_vs_own_optimum']:10.3f}")
  if record["cases"]:
    worst = max(r["ratio"] for r in record["cases"])
    lines.append(f"worst ratio {worst:.3f} (target <= 1.10)")
  g = record.get("gpt12_cut_seconds")
  if g:
    lines.append(f"12-layer GPT ({g['eqns']} eqns) cut into 8 blocks:"
                 f" {g['cold']:.2f} s cold, {g['warm']:.2f} s cached")
  return "\n".join(lines)


def main(args: BenchArgs, log: Callable[[str], None] = print) -> int:
  record = run(args, log)
  log(table(record))
  if args.output:
    os.makedirs(os.path.dirname(args.output) or ".", exist_ok=True)
    with open(args.output, "w") as f:
      json.dump(record, f, indent=1)
    log(f"wrote {args.output}")
  return 0
