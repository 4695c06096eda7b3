"""What the lowered program itself pays per tick, measured on the program.

The tick microbenchmark (``ticks.measure_tick_costs``) prices a toy tick: a
two-branch switch, one stash slot, one accumulator. A real lowered program
pays more per tick (measured on the model zoo, JAX 0.10.2, 2 CPU devices:
33-150 µs against the toy's ~1.5 µs): switches over several kernels, many
read and out ports, message rounds and their rendezvous, every gradient
accumulator of the device, the loop's carried state. None of it depends on
what the kernels compute, only on the program's shape.

So the program is measured with its kernels replaced by *stand-ins*
(:func:`standin_plan`): each kernel is traced abstractly for its output and
gradient shapes and returns, instead of its results, values of the same
shapes and dtypes filled with a scalar read from its first input, so the
program keeps every port, accumulation, stash write and ``ppermute``
(filled with zeros instead, XLA dropped the accumulations: eqx_transformer's
stand-in program ran in 2.6 ms against 5.9 ms). The stand-in program's step
time is what the program costs around its kernels; :func:`extra_tick_seconds`
turns it into the per-tick seconds that, added to the tick model, make the
prediction of the program with zero-time kernels equal that measurement.
The result is cached on disk by the plan's shape (:func:`plan_signature`).
"""

from __future__ import annotations

import dataclasses
import statistics
import time
from collections.abc import Callable, Mapping
from typing import Any

from tessel_jax.cost import compile_pool as _compile_pool


#: Bump when the stand-ins change what they cost (part of the cache key).
STANDIN_VERSION = 4  # 4: samples capped by CPU time (time_step)


def _seed(pvals: Any, dvals: Any) -> Any:
  """A float32 scalar read from one element of the kernel's first floating
  input (0 if it has none): the stand-in outputs depend on it, so XLA can
  fold neither them nor the accumulations and stash writes they feed.

  Reading every input in full instead (a sum of each) made the stand-in
  program of eqx_transformer cost 8.1 ms against 5.9 ms, the real program
  9.6 ms with 6.6 ms of kernels on its busier device: the kernels' own
  reads are already in their profiles.
  """
  import jax.numpy as jnp  # pylint: disable=import-outside-toplevel
  for x in list(dvals) + list(pvals):
    if hasattr(x, "dtype") and jnp.issubdtype(x.dtype, jnp.floating):
      return jnp.ravel(x)[0].astype(jnp.float32) * 1e-6
  return jnp.float32(0.0)


def _like(x: Any, s: Any) -> Any:
  """A value shaped like ``x``: ``s`` everywhere (zeros for non-floats)."""
  import jax.numpy as jnp  # pylint: disable=import-outside-toplevel
  if jnp.issubdtype(x.dtype, jnp.floating):
    return jnp.full(x.shape, s.astype(x.dtype), x.dtype)
  return jnp.zeros(x.shape, x.dtype)


def standin_fn(fn: Callable[..., Any]) -> Callable[..., Any]:
  """``fn(ctx, pvals, dvals) -> (outs, grads)`` with the same shapes and
  dtypes but near-free values (``fn`` is only traced for its shapes)."""

  def standin(ctx: Any, pvals: Any, dvals: Any) -> Any:
    import jax  # pylint: disable=import-outside-toplevel
    outs, grads = jax.eval_shape(lambda p, d: fn(ctx, p, d), list(pvals),
                                 list(dvals))
    s = _seed(pvals, dvals)
    return [_like(o, s) for o in outs], [_like(g, s) for g in grads]

  return standin


def standin_plan(plan: Any) -> Any:
  """``plan`` (``passes.plan_ir.Plan``) with every kernel a stand-in."""
  kernels = {kid: dataclasses.replace(k, fn=standin_fn(k.fn))
             for kid, k in plan.kernels.items()}
  return dataclasses.replace(plan, kernels=kernels)


def _avals(xs: Any) -> list[Any]:
  return [(tuple(int(d) for d in a.shape), str(a.dtype)) for a in xs]


def _round(rd: Any) -> list[Any]:
  return [int(rd.payload.nbytes), bool(rd.remote), len(rd.targets),
          len(rd.candidates), bool(rd.rowed)]


def plan_signature(plan: Any) -> dict[str, Any]:
  """What decides the program's cost around its kernels: per tick its
  kernels per device, read / out / gradient ports and message rounds; the
  segments, pools and parameter layout (sizes, slot classes with their
  GSPMD specs, pipe-sharded and gathered leaves): JSON-able, for a cache
  key."""
  ticks = []
  for t in plan.ticks:
    ticks.append([
        int(t.step), [None if k is None else int(k) for k in t.kernels],
        _avals(rp.aval for rp in t.reads), _avals(t.out_ports),
        [_round(rd) for rd in t.sends],
        [int(g.nbytes) for g in t.grads], len(t.terms)])
  kernels = {str(kid): [k.label, _avals(k.out_avals), list(k.grads),
                        list(k.params)]
             for kid, k in sorted(plan.kernels.items())}
  return {"ticks": ticks, "kernels": kernels,
          "segments": plan.loop_summary(),
          "pools": [[_avals([p.aval]), int(p.slots)] for p in plan.pools],
          "n": int(plan.num_microbatches),
          "layout": {str(dt): int(v) for dt, v in
                     sorted(plan.layout.size.items(), key=str)},
          "classes": [[list(c.shape), str(c.dtype), int(c.count),
                       repr(c.spec), repr(c.fsdp)]
                      for c in plan.layout.classes],
          "shards": repr(sorted(plan.layout.shards.items())),
          "gathered": repr(sorted(plan.layout.gathered))}


#: A sample's wall seconds count at most this many times the process CPU
#: seconds over the cores its devices can use (``time_step``). A stand-in
#: program waits at its rendezvous: its fastest samples take 1.76-1.86x that
#: CPU figure (README GPT, interleaved pipe2 x dp2 and vshape pipe4 stand-ins,
#: 4 fake devices on 2 cores, 40 samples each at load 8-9; a lowered step
#: with real kernels 1.15-1.25x). On a loaded machine a sample also waits
#: for a core: one stand-in's median was 4.25x while its fastest was 1.86x,
#: and at load 11 a stand-in timed at 227 ms where its siblings took 28-34
#: ms made its plan 249 ms predicted for a 31 ms replay (the "6 MiB
#: mispredictions" of session 27).
WAIT_SLACK = 2.5


def cpu_cores_of(out: Any) -> int:
  """Cores the devices of ``out`` (a program's result) run on: CPU
  devices (one thread each) up to the cores this process may use; 0 where
  the process's CPU time says nothing about the program (an accelerator,
  or no device known)."""
  import os  # pylint: disable=import-outside-toplevel
  import jax  # pylint: disable=import-outside-toplevel
  devices = set()
  for leaf in jax.tree_util.tree_leaves(out):
    sharding = getattr(leaf, "sharding", None)
    if sharding is not None:
      devices |= set(sharding.device_set)
  if not devices or any(d.platform != "cpu" for d in devices):
    return 0
  try:
    cores = len(os.sched_getaffinity(0))
  except AttributeError:  # not on Linux
    cores = os.cpu_count() or 1
  return max(1, min(len(devices), cores))


def sample_seconds(wall_s: float, cpu_s: float, cores: int) -> float:
  """One timed call: its wall seconds, but at most :data:`WAIT_SLACK`
  times its process CPU seconds over ``cores`` (what it waited for a busy
  neighbour's core is not the program's); ``cores`` 0: the wall time."""
  if cores <= 0:
    return wall_s
  return min(wall_s, WAIT_SLACK * cpu_s / cores)


def time_step(run: Callable[[], Any], repeats: int = 7, rounds: int = 3,
              budget_s: float = 1.5, fastest: bool = False) -> float:
  """Seconds of one call of ``run`` (compiled; warmed up first): the
  smallest of ``rounds`` medians of ``repeats`` samples each, as kernels
  are timed (``measure.time_kernel``: a round slowed by a busy neighbour is
  an outlier upwards, never downwards), each sample capped by the process
  CPU time on the CPU backend (:func:`sample_seconds`: a loaded machine
  slows every round). A slow program takes fewer samples (at least 3 in
  all), about ``budget_s`` seconds in all. ``fastest``: the fastest
  sample instead (the machine's per-port record took it until
  ``ports.PORTS_VERSION`` 8: at load 18.5 on 2 cores six timings of one
  stand-in gave 2.6-5.1 ms by round medians and 2.0-2.6 ms, one 3.6, by
  the fastest sample, but five fresh records spread 5x, helper zoo8; it
  now takes round medians over more rounds, ``ports.RECORD_ROUNDS``)."""
  import jax  # pylint: disable=import-outside-toplevel
  t0 = time.perf_counter()
  _compile_pool.drain()  # no background compile while timing
  cores = cpu_cores_of(jax.block_until_ready(run()))
  first = max(time.perf_counter() - t0, 1e-6)
  total = max(3, min(repeats * rounds, int(budget_s / first)))
  rounds = max(1, min(rounds, total // 3))
  per = max(1, total // rounds)
  medians = []
  for _ in range(rounds):
    samples = []
    for _ in range(per):
      t0, c0 = time.perf_counter(), time.process_time()
      jax.block_until_ready(run())
      samples.append(sample_seconds(time.perf_counter() - t0,
                                    time.process_time() - c0, cores))
    medians.append(min(samples) if fastest else statistics.median(samples))
  return min(medians)


def extra_tick_seconds(measured_s: float,
                       replay: Callable[[float], float],
                       probe_s: float = 1e-4) -> float:
  """Seconds to add to every tick so that ``replay`` (the prediction of
  the program with zero-time kernels, given the added seconds per tick)
  equals ``measured_s`` (the stand-in program's step).

  The replay grows linearly in the added seconds (every device runs every
  tick); a negative result means the tick model already over-prices.
  """
  base = replay(0.0)
  slope = (replay(probe_s) - base) / probe_s
  if slope <= 0:
    return 0.0
  return (measured_s - base) / slope


def _concrete(tree: Any) -> Any:
  """``tree`` with every abstract leaf (``ShapeDtypeStruct``) as zeros."""
  import jax  # pylint: disable=import-outside-toplevel
  import jax.numpy as jnp  # pylint: disable=import-outside-toplevel
  return jax.tree_util.tree_map(
      lambda x: x if hasattr(x, "block_until_ready") or not hasattr(
          x, "shape") else jnp.zeros(x.shape, x.dtype), tree)


def program_timer(make_program: Callable[[Any], Callable[..., Any]],
                  params: Any, batch: Any, repeats: int = 7
                  ) -> Callable[[Any], float]:
  """``plan -> seconds of one step``: compiles ``make_program(plan)`` (the
  lowered ``(params, batch)`` program of a plan) and times it on
  ``params`` and ``batch`` (:func:`time_step` of ``rounds`` rounds;
  ``fastest=True``: its fastest sample)."""
  params, batch = _concrete(params), _concrete(batch)

  def run(plan: Any, fastest: bool = False, rounds: int = 3) -> float:
    runner = program_runner(make_program, params, batch, plan)
    kept = getattr(make_program, "compiled", None)
    if kept is not None:  # the caller times it again (kept_runner)
      kept[_program_key(plan)] = runner
    return time_step(runner, repeats, rounds, fastest=fastest)

  return run


def _program_key(plan: Any) -> str:
  from tessel_jax.cost.cache import make_key  # pylint: disable=import-outside-toplevel
  return make_key({"plan": plan_signature(plan)})


def kept_runner(make_program: Any, plan: Any) -> Callable[[], Any] | None:
  """The compiled program of ``plan`` that :func:`program_timer` kept on
  ``make_program`` (when it has a ``compiled`` dict), or None."""
  kept = getattr(make_program, "compiled", None)
  return None if kept is None else kept.get(_program_key(plan))


def program_runner(make_program: Callable[[Any], Callable[..., Any]],
                   params: Any, batch: Any, plan: Any) -> Callable[[], Any]:
  """``make_program(plan)`` compiled on ``params`` and ``batch``: a
  no-argument call of one step (for :func:`time_step`)."""
  import jax  # pylint: disable=import-outside-toplevel
  params, batch = _concrete(params), _concrete(batch)
  compiled = jax.jit(make_program(plan)).lower(params, batch).compile()
  return lambda: compiled(params, batch)


def _standin_key(plan: Any, fields: Mapping[str, Any]) -> str:
  from tessel_jax.cost.cache import make_key  # pylint: disable=import-outside-toplevel
  return make_key({"what": "standin", "version": STANDIN_VERSION, **fields,
                   "plan": plan_signature(plan)})


def standin_cached(plan: Any, cache: Any, fields: Mapping[str, Any]) -> bool:
  """Whether the stand-in seconds of ``plan`` are in the disk cache (a
  file check: ``cache.get`` would count a miss)."""
  import os  # pylint: disable=import-outside-toplevel
  return not cache.reprofile and os.path.exists(
      cache.path("standin", _standin_key(plan, fields)))


def cached_standin_seconds(plan: Any, run_standin: Callable[[Any], float],
                           cache: Any, fields: Mapping[str, Any]
                           ) -> tuple[float, bool]:
  """``(seconds of the stand-in program of plan, from the cache?)``.

  ``run_standin(standin_plan)`` compiles and times the program;
  ``fields``: the mesh and backend facts of the key.
  """
  key = _standin_key(plan, fields)
  rec = cache.get("standin", key)
  if rec is not None:
    return float(rec["standin_s"]), True
  sec = float(run_standin(standin_plan(plan)))
  cache.put("standin", key, {"standin_s": sec})
  return sec, False


def store_standin_seconds(plan: Any, seconds: float, cache: Any,
                          fields: Mapping[str, Any]) -> None:
  """Replaces the stand-in seconds of ``plan`` in the disk cache (a
  figure timed again side by side with another plan's, ``choice_standins``)."""
  cache.put("standin", _standin_key(plan, fields),
            {"standin_s": float(seconds), "paired": True})
