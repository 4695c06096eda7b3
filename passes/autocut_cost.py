"""Per-equation cost for the automatic cut: a roofline estimate, calibrated
by timing groups of equations on the backend.

The automatic cut (``passes.autocut``) needs the cost of every contiguous run
of top-level equations; it uses an additive model, one number per equation,
so the cost of a run is a prefix-sum difference.

* ``analytic``: per equation, ``flops`` (2 x multiply-adds for
  ``dot_general`` and convolutions, one per output element for elementwise
  ops, one per input element for reductions; nested jaxprs counted inside,
  a scan's body times its length) and ``bytes`` (operands + results; reshapes
  and other views are free), combined as a roofline ``max(flops / peak,
  bytes / bandwidth)`` with per-backend defaults. Microseconds to compute.
* ``measured``: the equations are split into contiguous groups of roughly
  equal estimated cost (aligned to repeated layers); each distinct group is
  compiled alone and timed on the device (warm-up, then interleaved rounds
  over all groups keeping each group's fastest run, ``block_until_ready``;
  forward + backward when training), the call overhead of an empty program
  is subtracted, and each group's measured time is spread over its
  equations in proportion to their roofline estimates. Group times are
  cached in-process by the group's structure, so identical layers are timed
  once, and (given a ``cost.cache.ProfileCache``) on disk, so a new process
  cuts the program as the last one did and finds its kernels in the kernel
  cache; groups are compiled on a few threads.

In training the roofline counts a backward of twice the forward's work for
contractions and once for other differentiable ops.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
import time
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from tessel_jax import compat
from tessel_jax.cost import compile_pool as _compile_pool

from . import autocut_ticks
from .eqn_cost import (  # noqa: F401  (re-exported)
    EqnCost, analytic_costs, eqn_cost, nbytes)

# (peak flop/s, memory bytes/s) per platform: orders of magnitude only, the
# measured mode replaces them.
ROOFLINE = {
    "cpu": (5e10, 1e10),
    "gpu": (1e14, 2e12),
    "cuda": (1e14, 2e12),
    "rocm": (1e14, 2e12),
    "tpu": (2e14, 1e12),
}


def _platform(device: Any | None) -> str:
  dev = device if device is not None else jax.devices()[0]
  return str(getattr(dev, "platform", "cpu")).lower()


def roofline_seconds(costs: Sequence[EqnCost], *, train: bool = False,
                     platform: str = "cpu",
                     roofline: tuple[float, float] | None = None) -> np.ndarray:
  """Seconds per equation: ``max(flops / peak, bytes / bandwidth)``.

  Args:
    costs: From :func:`analytic_costs`.
    train: Add a backward (2x the forward for contractions, 1x otherwise).
    platform: Picks the defaults in ``ROOFLINE``.
    roofline: ``(peak flop/s, bytes/s)`` overriding the defaults.
  """
  peak, bw = roofline or ROOFLINE.get(platform, ROOFLINE["cpu"])
  out = np.zeros(len(costs))
  for i, c in enumerate(costs):
    flops, moved = c.flops, c.bytes
    if train:
      # Backward: 2x the forward for contractions, 1x for the rest.
      flops = 2.0 * c.flops + c.contraction_flops
      moved = 2.0 * moved
    out[i] = max(flops / peak, moved / bw)
  return out


# --- measured: time contiguous groups of equations ---------------------------


def _split(estimate: np.ndarray, a: int, b: int, count: int) -> list[int]:
  """Inner boundaries splitting ``[a, b)`` into ``count`` runs of equal cost."""
  count = max(1, min(count, b - a))
  prefix = np.concatenate([[0.0], np.cumsum(estimate[a:b])])
  total = prefix[-1]
  cuts = [0]
  for g in range(1, count):
    if total > 0:
      p = int(np.searchsorted(prefix, total * g / count, side="left"))
    else:
      p = round((b - a) * g / count)
    p = min(max(p, cuts[-1] + 1), (b - a) - (count - g))
    if p > cuts[-1]:
      cuts.append(p)
  return [a + p for p in cuts[1:]]


def _eqn_key(eqn: Any) -> str:
  params = sorted((k, repr(v)) for k, v in compat.eqn_params(eqn).items())
  ins = [("lit" if compat.is_literal(v) else str(v.aval)) for v in eqn.invars]
  outs = [str(v.aval) for v in eqn.outvars]
  return f"{compat.primitive_name(eqn)}{params}{ins}{outs}"


def find_period(keys: Sequence[Any]) -> tuple[int, int, int]:
  """The longest run of a repeated equation sequence (identical layers).

  Returns:
    ``(start, period, repeats)``: equations ``[start, start + period *
    repeats)`` are ``repeats`` copies of one sequence of ``period``
    equations; ``(0, 0, 0)`` when nothing repeats.
  """
  ids: dict[Any, int] = {}
  k = np.array([ids.setdefault(x, len(ids)) for x in keys], dtype=np.int64)
  n = len(k)
  best = (0, 0, 0)
  best_cover = 0
  for period in range(1, n // 2 + 1):
    same = np.concatenate([[False], k[:-period] == k[period:], [False]])
    edges = np.flatnonzero(np.diff(same.astype(np.int8)))
    if not len(edges):
      continue
    starts, stops = edges[0::2], edges[1::2]
    lengths = stops - starts
    j = int(np.argmax(lengths))
    repeats = (int(lengths[j]) + period) // period
    cover = repeats * period
    if repeats >= 2 and cover > best_cover:
      best, best_cover = (int(starts[j]), period, repeats), cover
  return best


def group_bounds(eqns: Sequence[Any], estimate: np.ndarray,
                 num_groups: int) -> list[tuple[int, int]]:
  """Contiguous groups to time, aligned to repeated layers.

  When a run of identical layers is found (:func:`find_period`), every
  layer is split at the same offsets, so the layers' groups are identical
  and timed once; ``num_groups`` is then the number of *distinct* groups
  (shared by the part before the layers, one layer and the part after, in
  proportion to their estimated cost). Otherwise the equations are split
  into ``num_groups`` runs of equal estimated cost.
  """
  n = len(eqns)
  estimate = np.asarray(estimate, dtype=float)
  start, period, repeats = find_period([_eqn_key(e) for e in eqns])
  if not period or period * repeats < n // 3:
    cuts = _split(estimate, 0, n, num_groups)
  else:
    stop = start + period * repeats
    parts = [(0, start), (start, start + period), (stop, n)]
    cost = [estimate[a:b].sum() for a, b in parts]
    total = sum(cost) or 1.0
    count = [0 if b <= a else max(1, round(num_groups * c / total))
             for (a, b), c in zip(parts, cost)]
    inner = _split(estimate, start, start + period, count[1])
    cuts = _split(estimate, 0, start, count[0]) if start else []
    for r in range(repeats):
      base = start + r * period
      if base:
        cuts.append(base)
      cuts.extend(base + (c - start) for c in inner)
    if stop < n:
      cuts.append(stop)
      cuts.extend(_split(estimate, stop, n, count[2]))
  bounds = [0, *sorted(set(c for c in cuts if 0 < c < n)), n]
  return list(zip(bounds, bounds[1:]))


@dataclasses.dataclass(frozen=True, eq=False)
class _Group:
  """A contiguous run of equations as a standalone function."""

  eqns: tuple[Any, ...]
  invars: tuple[Any, ...]
  outvars: tuple[Any, ...]
  key: str


def _make_group(eqns: Sequence[Any], used_after: set[Any],
                const_vars: set[Any]) -> _Group:
  local: set[Any] = set()
  invars: list[Any] = []
  seen: set[Any] = set()
  for eqn in eqns:
    for v in eqn.invars:
      if compat.is_literal(v) or v in local or v in seen:
        continue
      seen.add(v)
      invars.append(v)
    local.update(v for v in eqn.outvars if not compat.is_dropvar(v))
  outvars = [v for e in eqns for v in e.outvars
             if not compat.is_dropvar(v) and v in used_after]
  # Structural key: primitives, params, shapes and the wiring, with the
  # variables renamed by first appearance.
  names: dict[Any, int] = {}

  def name(v: Any) -> str:
    if compat.is_literal(v):
      return f"lit:{compat.literal_value(v)!r}"
    tag = "c" if v in const_vars else "v"
    if v not in names:
      names[v] = len(names)
    return f"{tag}{names[v]}:{v.aval}"

  parts = []
  for eqn in eqns:
    ins = ",".join(name(v) for v in eqn.invars)
    outs = ",".join(name(v) for v in eqn.outvars if not compat.is_dropvar(v))
    params = sorted((k, repr(p)) for k, p in compat.eqn_params(eqn).items())
    parts.append(f"{compat.primitive_name(eqn)}{params}({ins})->({outs})")
  parts.append("out:" + ",".join(name(v) for v in outvars))
  key = hashlib.sha1(";".join(parts).encode()).hexdigest()
  return _Group(tuple(eqns), tuple(invars), tuple(outvars), key)


def _example(aval: Any, rng: np.random.Generator) -> Any:
  dtype = np.dtype(aval.dtype)
  shape = tuple(aval.shape)
  if np.issubdtype(dtype, np.floating) or dtype == jnp.bfloat16:
    return jnp.asarray(rng.uniform(0.1, 0.9, shape).astype(np.float32),
                       dtype=aval.dtype)
  if dtype == np.bool_:
    return jnp.ones(shape, bool)
  return jnp.zeros(shape, aval.dtype)


def _group_fn(group: _Group, train: bool,
              conv_forms: bool = False) -> Callable[..., Any]:
  def forward(*args: Any) -> list[Any]:
    return autocut_ticks.evaluate(group.eqns, group.invars, group.outvars,
                                  args, conv_forms=conv_forms)

  if not train:
    return forward
  diff_in = [i for i, v in enumerate(group.invars)
             if jnp.issubdtype(v.aval.dtype, jnp.inexact)]
  diff_out = [i for i, v in enumerate(group.outvars)
              if jnp.issubdtype(v.aval.dtype, jnp.inexact)]
  if not diff_in or not diff_out:
    return forward

  def forward_backward(*args: Any) -> Any:
    def f(*xs: Any) -> list[Any]:
      full = list(args)
      for i, x in zip(diff_in, xs):
        full[i] = x
      outs = forward(*full)
      return [outs[i] for i in diff_out]

    outs, vjp = jax.vjp(f, *[args[i] for i in diff_in])
    return outs, vjp([jnp.ones_like(o) for o in outs])

  return forward_backward


@dataclasses.dataclass(frozen=True, eq=False)
class Segment:
  """Equations ``[start, stop)`` of a jaxpr as a runnable program.

  Attributes:
    fn: Jitted forward (or forward + backward) of the equations.
    args: Example inputs (constants as they are, other inputs filled in).
    key: Structural key: equal for identical segments (e.g. two layers).
  """

  fn: Callable[..., Any]
  args: tuple[Any, ...]
  key: str


def segment(closed_jaxpr: Any, start: int, stop: int, *, train: bool = False,
            seed: int = 0) -> Segment:
  """Equations ``[start, stop)`` of ``closed_jaxpr`` as a program to time.

  Its outputs are the values later equations (or the function's outputs)
  read; with ``train`` it also runs the backward (``jax.vjp`` with ones as
  output cotangents).
  """
  jaxpr = closed_jaxpr.jaxpr
  eqns = jaxpr.eqns
  used_after = {v for e in eqns[stop:] for v in e.invars
                if not compat.is_literal(v)}
  used_after.update(v for v in jaxpr.outvars if not compat.is_literal(v))
  group = _make_group(eqns[start:stop], used_after, set(jaxpr.constvars))
  consts = dict(zip(jaxpr.constvars, closed_jaxpr.consts))
  rng = np.random.default_rng(seed)
  args = tuple(consts[v] if v in consts else _example(v.aval, rng)
               for v in group.invars)
  return Segment(jax.jit(_group_fn(group, train)), args, group.key)


def _time_calls(calls: Sequence[tuple[Callable[..., Any], Sequence[Any]]],
                repeats: int, min_seconds: float) -> list[float]:
  """Fastest run of each call, timed in interleaved rounds.

  Every call is warmed up (compiled) first; then each round runs every call
  once, so a change of load from other processes hits all calls alike.
  Rounds go on until ``repeats`` are done and (up to ``20 * repeats``) the
  timed runs add up to ``min_seconds`` per call.
  """
  _compile_pool.drain()  # no background compile while timing
  for fn, args in calls:
    jax.block_until_ready(fn(*args))
  best = [np.inf] * len(calls)
  spent = 0.0
  rounds = 0
  while rounds < repeats or (spent < min_seconds * len(calls) and
                             rounds < 20 * repeats):
    for i, (fn, args) in enumerate(calls):
      t0 = time.perf_counter()
      jax.block_until_ready(fn(*args))
      dt = time.perf_counter() - t0
      spent += dt
      best[i] = min(best[i], dt)
    rounds += 1
  return best


def _compile_workers(jobs: int) -> int:
  """Compile threads for ``jobs`` group programs (XLA releases the GIL)."""
  return max(1, min(jobs, (os.cpu_count() or 1), 8))


_GROUP_CACHE: dict[tuple[str, str, bool], float] = {}
_OVERHEAD_CACHE: dict[str, float] = {}


def _overhead(device: Any) -> float:
  key = str(device)
  if key not in _OVERHEAD_CACHE:
    x = jax.device_put(jnp.zeros((8,), jnp.float32), device)
    fn = jax.jit(lambda a: a + 1.0)
    _OVERHEAD_CACHE[key] = _time_calls([(fn, [x])], repeats=21,
                                       min_seconds=0.01)[0]
  return _OVERHEAD_CACHE[key]


@dataclasses.dataclass(frozen=True)
class MeasuredCosts:
  """Per-equation seconds from timed groups.

  Attributes:
    seconds: Per equation.
    groups: ``(start, stop)`` equation ranges timed.
    group_seconds: Measured seconds per group (overhead removed).
    timed: Groups compiled and timed now (the rest came from the cache).
    wall_seconds: Time spent measuring.
  """

  seconds: np.ndarray
  groups: tuple[tuple[int, int], ...]
  group_seconds: tuple[float, ...]
  timed: int
  wall_seconds: float


def group_disk_key(key: tuple[str, str, bool]) -> str:
  """Disk cache key of a timed group (``(structure, device kind, train)``),
  with everything else that changes its time (JAX, speed flags, cores)."""
  from tessel_jax.cost import cache as _cache  # pylint: disable=import-outside-toplevel
  from tessel_jax.cost import call_timing as _call_timing  # pylint: disable=import-outside-toplevel
  from tessel_jax.cost import measure as _measure  # pylint: disable=import-outside-toplevel
  return _cache.make_key({
      "what": "autocut_group", "group": key[0], "device_kind": key[1],
      "train": key[2], "jax": jax.__version__,
      "xla_flags": _measure.speed_flags(), "cpu_cores": _call_timing.cpu_cores()})


def _from_disk(cache: Any, keys: Sequence[tuple[str, str, bool]]) -> None:
  """Fills ``_GROUP_CACHE`` with the stored timings of ``keys``."""
  if cache is None:
    return
  for key in keys:
    if key not in _GROUP_CACHE:
      rec = cache.get("group", group_disk_key(key))
      if rec is not None:
        _GROUP_CACHE[key] = float(rec["seconds"])


def measured_costs(closed_jaxpr: Any, *, train: bool = False,
                   num_groups: int = 12, device: Any | None = None,
                   repeats: int = 7, min_seconds: float = 0.005,
                   estimate: np.ndarray | None = None,
                   seed: int = 0, cache: Any = None,
                   per_step: Sequence[bool] | None = None,
                   ticks: bool = False, conv_forms: bool = False,
                   num_params: int = 0) -> MeasuredCosts:
  """Times contiguous groups of top-level equations; spreads by estimate.

  Args:
    closed_jaxpr: The traced function (top-level equations are costed).
    train: Time forward + backward (``jax.vjp``) of each group.
    num_groups: Distinct groups to time (see :func:`group_bounds`).
    device: Where to run (default: the first device).
    repeats: Timed rounds (every group runs once per round; the fastest
      run of each group is kept).
    min_seconds: More rounds (up to ``20 * repeats``) until the timed runs
      add up to this much per group.
    estimate: Per-equation estimates for grouping and spreading (default:
      the roofline).
    seed: Seed for the example inputs.
    cache: A ``tessel_jax.cost.cache.ProfileCache``: group timings are read
      from it and new ones stored (None: this process only).
    per_step: Per equation, True where the placed program runs it once per
      step rather than per micro-batch (parameter-only work the lowering
      hoists, ``passes.hoist``): such equations cost 0 and are left out of
      the timed groups, whose programs read (and, training, differentiate)
      their outputs as inputs, as the program's kernels do.
    ticks: Compile each group as the ticks run kernels
      (``passes.autocut_ticks.tick_form``): in a ``lax.cond`` branch, its
      parameter-only values (on the first ``num_params`` inputs and the
      ``per_step`` values it reads) computed beforehand.
    conv_forms: Bind the groups' convolutions in XLA:CPU's canonical order,
      as the kernels do with ``Switches.conv_forms`` on a CPU mesh
      (``passes.conv_forms``).
    num_params: The function's leading parameter inputs, whose
      parameter-only work the lowering hoists (for ``ticks``; 0: none
      hoisted).

  Returns:
    :class:`MeasuredCosts`.
  """
  t_start = time.perf_counter()
  device = device if device is not None else jax.devices()[0]
  jaxpr = closed_jaxpr.jaxpr
  eqns = list(jaxpr.eqns)
  if estimate is None:
    estimate = roofline_seconds(analytic_costs(eqns), train=train,
                                platform=_platform(device))
  estimate = np.asarray(estimate, dtype=float)
  skip = (np.zeros(len(eqns), bool) if per_step is None
          else np.asarray(per_step, dtype=bool))
  if skip.shape != (len(eqns),):
    raise ValueError(f"per_step has {skip.shape[0] if skip.ndim else 0}"
                     f" entries for {len(eqns)} equations")
  estimate = np.where(skip, 0.0, estimate)
  bounds = group_bounds(eqns, estimate, num_groups)
  groups = _groups_of(jaxpr, bounds, skip)
  kind = f"{_platform(device)}:{getattr(device, 'device_kind', '')}"
  form = ((f"|ticks{int(num_params > 0)}" if ticks else "") +
          ("|conv_forms" if conv_forms else ""))
  keys = [(group.key + form, kind, train) for group in groups]
  _from_disk(cache, keys)
  # What the kernels read as hoisted values or parameters (none: nothing
  # is hoisted, the group computes all its parameter-only work).
  given = set(jaxpr.invars[:num_params]) | {
      v for i, e in enumerate(eqns) if skip[i] for v in e.outvars}
  timed = _time_groups(
      groups, keys, closed_jaxpr, device=device, train=train,
      rng=np.random.default_rng(seed), given=given if ticks else None,
      conv_forms=conv_forms, repeats=repeats, min_seconds=min_seconds,
      cache=cache)
  seconds, group_seconds = _spread(bounds, keys, estimate, skip)
  return MeasuredCosts(seconds=seconds, groups=tuple(bounds),
                       group_seconds=tuple(group_seconds), timed=timed,
                       wall_seconds=time.perf_counter() - t_start)


def _groups_of(jaxpr: Any, bounds: Sequence[tuple[int, int]],
               skip: np.ndarray) -> list[_Group]:
  """One timed group per ``[a, b)`` of ``bounds``: its equations but the
  skipped (per-step) ones, returning what is read at or after ``b``."""
  eqns = jaxpr.eqns
  last_use: dict[Any, int] = {}
  for i, eqn in enumerate(eqns):
    for v in eqn.invars:
      if not compat.is_literal(v):
        last_use[v] = i
  for v in jaxpr.outvars:
    if not compat.is_literal(v):
      last_use[v] = len(eqns)
  const_vars = set(jaxpr.constvars)
  groups = []
  for a, b in bounds:
    used_after = {v for v, last in last_use.items() if last >= b}
    groups.append(_make_group(
        [e for i, e in enumerate(eqns[a:b], a) if not skip[i]],
        used_after, const_vars))
  return groups


def _time_groups(groups: Sequence[_Group],
                 keys: Sequence[tuple[str, str, bool]], closed_jaxpr: Any,
                 *, device: Any, train: bool, rng: np.random.Generator,
                 given: set[Any] | None, conv_forms: bool, repeats: int,
                 min_seconds: float, cache: Any) -> int:
  """Times the groups whose keys :data:`_GROUP_CACHE` lacks, into it (and
  into ``cache``); ``given``: the values the tick form takes as computed
  beforehand (None: compiled at the top level). Returns how many were
  timed."""
  from tessel_jax.cost import compile_pool  # pylint: disable=import-outside-toplevel
  consts = dict(zip(closed_jaxpr.jaxpr.constvars, closed_jaxpr.consts))
  pending: dict[tuple[str, str, bool], _Group] = {}
  for group, key in zip(groups, keys):
    if key in _GROUP_CACHE or key in pending:
      continue
    if not group.outvars:  # dead code: XLA drops it from the real program
      _GROUP_CACHE[key] = 0.0
      continue
    pending[key] = group

  def lower(key: tuple[str, str, bool]) -> Any:
    group = pending[key]
    args = [jax.device_put(consts[v], device) if v in consts else
            jax.device_put(_example(v.aval, rng), device)
            for v in group.invars]
    fn = _group_fn(group, train, conv_forms)
    if given is not None:
      fn, args = autocut_ticks.tick_form(
          fn, args, [v in given for v in group.invars])
    return compile_pool.Lowered(jax.jit(fn).lower(*args), args, [], None, 0.0)
  # Each group compiled as soon as it is lowered, the next lowered
  # meanwhile; all compiled before the first is timed.
  calls = [(p.compiled, p.pv) for p in compile_pool.compile_pipelined(
      list(pending), lower, _compile_workers(len(pending)))]
  overhead = _overhead(device)
  for key, t in zip(pending, _time_calls(calls, repeats, min_seconds)):
    _GROUP_CACHE[key] = max(0.0, t - overhead)
    if cache is not None:
      cache.put("group", group_disk_key(key), {"seconds": _GROUP_CACHE[key]})
  return len(pending)


def _spread(bounds: Sequence[tuple[int, int]],
            keys: Sequence[tuple[str, str, bool]], estimate: np.ndarray,
            skip: np.ndarray) -> tuple[np.ndarray, list[float]]:
  """Per-equation seconds: each group's time spread over its equations by
  ``estimate`` (evenly over the unskipped ones where it estimates 0), and
  the groups' times."""
  seconds = np.zeros(len(estimate))
  group_seconds = []
  for (a, b), key in zip(bounds, keys):
    t = _GROUP_CACHE[key]
    group_seconds.append(t)
    est = estimate[a:b]
    if est.sum() <= 0:
      est = np.where(skip[a:b], 0.0, 1.0)
    seconds[a:b] = t * est / est.sum() if est.sum() > 0 else 0.0
  return seconds, group_seconds


def platform_of(device: Any | None) -> str:
  """Platform name of ``device`` (default: the first device)."""
  return _platform(device)


__all__ = ["EqnCost", "MeasuredCosts", "ROOFLINE", "Segment", "analytic_costs",
           "eqn_cost", "find_period", "group_bounds", "measured_costs",
           "nbytes", "platform_of", "roofline_seconds", "segment"]

