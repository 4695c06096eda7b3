"""What the lowered program adds per tick, for the step-time prediction.

The lowering (``passes.lower``) runs the schedule as *ticks*: at every step
at which some block starts, every device of the pipe axis writes the
previous tick's local messages into its stash and the held remote rounds
due at this tick (``passes.flushes``: merged ``ppermute``s at the first
tick reading one of them), reads its inputs and runs a ``lax.switch`` over
the tick's kernels (idle devices run a branch returning zero out ports); the
branch of a kernel with parameter gradients adds them in place to its
accumulators, the other branches pass them through. In an interpreted
segment (``passes.interp``) a device runs only its own kernel's ports
(each kernel in a 0/1-trip loop) but holds every message round of the
segment (``passes.held``), and is priced so per device
(:func:`interp_device_ports`, :func:`interp_device_traffic`).

Two costs follow, both measured by :func:`measure_tick_costs` (a
microbenchmark on the mesh, cached on disk) rather than assumed:

* **per tick**: ``fixed + per_byte * traffic`` on every device, where
  ``traffic`` (:func:`tick_traffic`) counts the bytes the tick's own
  operations read and write, following ``passes.lower``: every device
  materialises all out ports (the idle ones as zeros), copies its read
  ports out of the stash, adds the gradients of its kernel into the
  accumulators (at most ``GradPort.nbytes`` each) and writes every message
  into the stash (after a row slice, a select among candidates, a
  ``ppermute``); an interpreted tick costs each device its own kernel's
  ports and gradients and every message round (:func:`interp_device_traffic`);
  on the CPU backend ``fixed`` and ``per_byte`` are one device's
  core-seconds, which the replay shares among the cores;
* **transfers**: on XLA's CPU runtime a ``ppermute`` is a rendezvous of
  the devices: a tick's remote messages become an all-device barrier
  priced by the link model (``latency + bytes / bandwidth`` per round).
  XLA runs a following tick's kernel ahead of it when that kernel reads
  only micro-batch inputs (measured on 2 CPU devices, JAX 0.10.2: the
  V-shape's F0 overlapped the rendezvous after B1, the M-shape's F2, which
  reads the stash, did not, even though the rendezvous did not feed it);
  the barrier then moves after that tick. On other backends a transfer
  ties only its two devices: it is the delay of its graph edge.

The microbenchmark's toy tick misses most of what a real program pays per
tick (1.5 µs against 33-150 µs on the model zoo), in proportion to the
tick's port operations (:func:`tick_ports`), not its bytes:
``cost.ports`` measures the seconds per port operation once per machine
on a stand-in program (``TickCosts.per_port_s``), and ``cost="calibrated"``
measures each plan's own stand-in program and adds the difference to every
tick (:meth:`TickModel.plus`).
"""

from __future__ import annotations

import dataclasses
import functools
import statistics
import time
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from tessel_jax.cost import compile_pool as _compile_pool


@dataclasses.dataclass(frozen=True)
class TickCosts:
  """Measured cost of one tick: ``fixed_s + per_byte_s * traffic``.

  Attributes:
    fixed_s: Seconds of a tick with tiny ports (switch, stash write and
      read, loop step).
    per_byte_s: Seconds per byte of the tick's traffic (``tick_traffic``).
    source: ``"measured"``, ``"none"`` or ``"user"``.
    per_port_s: Seconds per port operation of the tick (``tick_ports``:
      read, out, gradient and message ports), what a real program pays
      per port beyond the microbenchmark's toy tick (0: not known; see
      ``cost.model.CostModel.port_seconds``).
    tick_ports: Port operations' worth every tick pays beyond its own
      ports, priced at ``per_port_s`` (the machine's record, fitted in
      ``cost.port_fit``).
  """

  fixed_s: float = 0.0
  per_byte_s: float = 0.0
  source: str = "none"
  per_port_s: float = 0.0
  tick_ports: float = 0.0

  def seconds(self, traffic: int, ports: float = 0) -> float:
    return (self.fixed_s + self.per_byte_s * traffic +
            self.per_port_s * (ports + self.tick_ports))

  def to_dict(self) -> dict[str, Any]:
    return dataclasses.asdict(self)


@dataclasses.dataclass(frozen=True)
class TickModel:
  """Per-tick costs of one lowered plan.

  Attributes:
    barriers: Step of a tick -> seconds of the all-device synchronisation
      (the transfers) before it.
    tick_costs: Step of a tick -> its fixed cost on every device.
    edge_delays: Whether the graph's edge delays apply (False where the
      barriers carry the transfers).
    barriers_after: Step of a tick -> seconds of an all-device
      synchronisation right after it.
    device_costs: Step of a tick whose cost differs between devices (an
      interp tick: each device pays for its own kernel's ports) -> its
      cost on each device; ``tick_costs`` then holds their mean.
  """

  barriers: Mapping[int, float]
  tick_costs: Mapping[int, float]
  edge_delays: bool
  barriers_after: Mapping[int, float] = dataclasses.field(default_factory=dict)
  device_costs: Mapping[int, tuple[float, ...]] = dataclasses.field(
      default_factory=dict)

  def tick_seconds(self, step: int) -> float | tuple[float, ...]:
    """The tick's cost: one figure for every device, or one per device."""
    per = self.device_costs.get(step)
    return per if per is not None else self.tick_costs.get(step, 0.0)

  @property
  def barrier_seconds(self) -> float:
    return sum(self.barriers.values()) + sum(self.barriers_after.values())

  @property
  def mean_tick_seconds(self) -> float:
    if not self.tick_costs:
      return 0.0
    return sum(self.tick_costs.values()) / len(self.tick_costs)

  def plus(self, extra_s: float) -> "TickModel":
    """This model with ``extra_s`` added to every tick (never below 0)."""
    if not extra_s:
      return self
    return dataclasses.replace(
        self, tick_costs={s: max(0.0, v + extra_s)
                          for s, v in self.tick_costs.items()},
        device_costs={s: tuple(max(0.0, v + extra_s) for v in per)
                      for s, per in self.device_costs.items()})

  def plus_calls(self, extra_s: float,
                 calls: Mapping[int, tuple[int, ...]]) -> "TickModel":
    """This model with ``extra_s`` added per kernel call: a tick's cost on
    a device grows by ``extra_s`` times the kernels that device runs in it
    (``calls``: step -> calls per device, :func:`kernel_calls`), never
    below 0.

    What a real program pays beyond the microbenchmark's toy tick
    (``calibrate.extra_tick_seconds``) goes with its kernel calls, not its
    ticks: spread over ticks, a schedule of the same blocks with fewer
    ticks came out cheaper than it measured (README GPT, vshape pipe2 x
    dp2: GPipe's 10 ticks priced 0.903x the searched plan's 13, measured
    1.033x paired CPU, BENCHMARKS.md, h/limits2, session 31); every
    schedule of one placement runs the same calls.
    """
    if not extra_s:
      return self
    device_costs = {}
    tick_costs = {}
    for step in set(self.tick_costs) | set(calls):
      base = self.tick_seconds(step)
      n = calls.get(step, ())
      if not isinstance(base, tuple):
        base = (base,) * max(1, len(n))
      per = tuple(max(0.0, v + extra_s * (n[d] if d < len(n) else 0))
                  for d, v in enumerate(base))
      device_costs[step] = per
      tick_costs[step] = sum(per) / len(per)
    return dataclasses.replace(self, tick_costs=tick_costs,
                               device_costs=device_costs)

  def delays(self, delay_seconds: Mapping[tuple[int, int], float]
             ) -> Mapping[tuple[int, int], float]:
    return delay_seconds if self.edge_delays else {}


#: Bump when what :func:`measure_tick_costs` measures changes (cache key).
#: 2: CPU core-seconds of one device (was: wall seconds of the mesh).
#: 3: inputs placed on the mesh once (were re-split at every call).
TICKS_VERSION = 3

# Backends where a ``ppermute`` is a rendezvous of every device.
RENDEZVOUS_BACKENDS = ("cpu",)

# Bytes moved per byte of each operation of a tick (read + write), as in
# ``passes.lower``; the microbenchmark's tick is counted the same way.
COPY = 2          # dynamic slice / index, update, ppermute: read + write
MATERIALISE = 1   # a switch output (kernel result or idle zeros): write
ACCUMULATE = 3    # acc + g: read both, write acc


#: Port operations a gradient port is priced as (``priced_ports``): an
#: accumulation of a gradient leaf (read the accumulator and the gradient,
#: add, write back at the slot), where a read, out port or message round is
#: one copy. Fitted on the stand-ins of the five zoo models and the
#: batch-norm CNN at real-time priority (2 devices, ``vshape(2)``, N = 8,
#: load 5-8, ``experiments.port_record_probe``): counted as 1,
#: eqx_transformer (416 gradient ports of 2,706) and penzai_llama (168 of
#: 2,297), alike in ports per tick, cost 4.2 and 2.3 ms above the tick
#: model, and the record fitted on all six priced their stand-ins 0.78x
#: and 1.20x; counted as 10, all six within 0.95-1.05x. Left at 1 then:
#: the zoo's steps were not reliably better predicted with 10 (four runs
#: at load 4-10: 2, 4, 2 and 3 of 5 within 15%, against 1 and 2 for the
#: base and 3-4 for 1 in the same hour; helper zoo9). 10 since
#: ``ports.PORTS_VERSION`` 11: with the record's fixed part held at
#: ``ports.TICK_PORTS`` (zoo12) the zoo's steps, alternated with 1 in one
#: hour at load 2.5-22, came within 15% in 4 of 5 models per run (median
#: of 10 runs; 3-5) against 3 (13 runs; 2-4) (``experiments.model_zoo_spans
#: --cost=measured``; eqx_transformer's median ratio 1.23 -> 1.08,
#: nnx_transformer's 0.99 -> 0.92; not measured quietly; BENCHMARKS.md,
#: helper zoo13, session 37).
GRAD_PORTS = 10.0


def priced_ports(tick: Any) -> float:
  """Port operations a tick is priced as on every device
  (``TickCosts.seconds``): :func:`tick_ports` with each gradient port
  worth :data:`GRAD_PORTS`."""
  return (len(tick.reads) + len(tick.out_ports) +
          GRAD_PORTS * len(tick.grads) + len(tick.sends))


def tick_ports(tick: Any) -> int:
  """Port operations of a tick on every device: its read ports, out ports,
  gradient ports and message rounds (each one or more small operations
  in the lowered program, whatever its bytes)."""
  return (len(tick.reads) + len(tick.out_ports) + len(tick.grads) +
          len(tick.sends))


def tick_traffic(tick: Any, layout: Any = None) -> int:
  """Bytes a tick's own operations move on one device (see module doc).

  ``layout`` is not needed (the gradient ports carry their bytes); it is
  accepted for older callers.
  """
  del layout
  n = _send_traffic(tick)
  n += sum(COPY * int(rp.aval.nbytes) for rp in tick.reads)
  n += sum(MATERIALISE * int(a.nbytes) for a in tick.out_ports)
  # Gradients are added in place in the owning kernel's branch only.
  n += sum(ACCUMULATE * int(gp.nbytes) for gp in tick.grads)
  return n


def _send_traffic(tick: Any) -> int:
  """Bytes the message rounds of ``tick`` move on one device (every device
  takes part in each round: a dummy where it sends nothing)."""
  n = 0
  for rd in tick.sends:
    p = int(rd.payload.nbytes)
    if rd.rowed:
      n += COPY * p
    if len(rd.candidates) > 1:
      n += (len(rd.candidates) + 1) * p
    if rd.remote:
      n += COPY * p
    n += COPY * p * len(rd.targets)
  return n


def _own_grad_bytes(spec: Any, kid: int, kernel: Any, layout: Any) -> int:
  """Bytes kernel ``kid`` adds into its accumulators at one run (its
  forward block's flat regions, its slot ports in ``spec.grad_map``, its
  gathered leaves): what its device accumulates in an interp tick."""
  if not kernel.grads:
    return 0
  n = 0
  for dt in getattr(layout, "dtypes", ()):
    region = layout.regions[dt].get(kernel.fwd)
    if region is not None and region.leaves:
      n += region.length * int(np.dtype(dt).itemsize)
  n += sum(int(spec.grads[i].nbytes)
           for i in spec.grad_map.get(kid, {}).values())
  gathered = getattr(layout, "gathered", {}) or {}
  n += sum(int(gathered[l].nbytes) for l in kernel.grads if l in gathered)
  return n


def interp_device_traffic(spec: Any, tick: Any, plan: Any
                          ) -> tuple[int, ...]:
  """Bytes one interp tick moves on each device (``passes.predicated``).

  ``spec`` is the segment's table-driven tick, ``tick`` the plan's tick at
  this step (its ``kernels``: the kernel each device runs). Every kernel
  of the segment sits in a 0/1-trip while loop that only its devices
  enter, updating its out ports and accumulators in place: a device reads
  its own kernel's ports, writes its out ports and adds its own gradients;
  it takes part in every message round of the segment (dummies where idle).
  Pricing the union of the segment's ports and accumulators on every
  device (what the switch it replaced copied) over-counted pipe4's 20
  interp ticks by 135 MiB of accumulator traffic per device and step.
  """
  sends = _send_traffic(spec)
  out = []
  for kid in tick.kernels:
    n = sends
    if kid is not None:
      n += sum(COPY * int(spec.reads[p].aval.nbytes)
               for p in spec.in_map.get(kid, ()))
      n += sum(MATERIALISE * int(spec.out_ports[o].nbytes)
               for o in spec.out_map.get(kid, ()))
      n += ACCUMULATE * _own_grad_bytes(spec, kid, plan.kernels[kid],
                                        plan.layout)
    out.append(n)
  return tuple(out)


def interp_device_ports(spec: Any, tick: Any) -> tuple[float, ...]:
  """Port operations one interp tick is priced as on each device: the read,
  out and gradient ports (each worth :data:`GRAD_PORTS`) of the kernel it
  runs (the others sit in 0/1-trip loops it does not enter) and every
  message round of the segment (each device copies its message, or a
  dummy, into the round's outbox at every tick).

  Measured on the model zoo: pricing the segment's whole table at every
  tick over-predicted penzai_llama's interp(26) + loop(5x1) 2.2x; the own
  ports without the segment's rounds under-priced hf_gpt2's interp(9) so
  that it ranked before a schedule measuring 10% faster.
  """
  out = []
  for kid in tick.kernels:
    n = float(len(spec.sends))
    if kid is not None:
      n += (len(spec.in_map.get(kid, ())) + len(spec.out_map.get(kid, ())) +
            GRAD_PORTS * len(spec.grad_map.get(kid, {})))
    out.append(n)
  return tuple(out)


def _remote_seconds(tick: Any, link: Any) -> float:
  return sum(link.seconds(int(rd.payload.nbytes))
             for rd in tick.sends if rd.remote)


def _iteration_ends(plan: Any) -> tuple[set[int], set[int]]:
  """Ticks ending a straight run or loop iteration, and interp ticks."""
  ends, interp = set(), set()
  for seg in plan.segments:
    if seg.kind == "interp":
      interp.update(range(seg.start, seg.end))
      ends.update(range(seg.start, seg.end))
    elif seg.kind == "loop":
      ends.update(seg.start + (k + 1) * seg.period - 1
                  for k in range(seg.iterations))
    else:
      ends.add(seg.end - 1)
  return ends, interp


def _deferred_barriers(plan: Any, link: Any) -> list[tuple[int, float]]:
  """``(tick, seconds)``: the rendezvous right after ``tick``, where the
  lowering writes held remote rounds (``passes.flushes``: at the first
  tick reading one of them, equal-shaped rounds in one ``ppermute``), per
  straight run and loop iteration, and after an interp segment's ticks
  where its held rounds flush (``passes.held``: each remote round with a
  1 in its ``flush`` table at boundary ``f`` is one ``ppermute`` after the
  segment's tick ``f - 1``)."""
  # pylint: disable=import-outside-toplevel
  try:  # installed: passes/ is tessel_jax.passes
    from tessel_jax.passes import flushes  # type: ignore
  except ImportError:  # run from the repository root
    from passes import flushes  # type: ignore
  ticks = plan.ticks
  out = []
  for seg in plan.segments:
    if seg.kind == "interp":
      out.extend(_interp_flushes(plan.interps[seg.start], seg.start, link))
      continue
    body = list(range(seg.start, seg.start + seg.period))
    rounds_at = flushes.remote_flushes(ticks, body)
    for k in range(seg.iterations):
      shift = k * seg.period
      for i, positions in enumerate(rounds_at):
        rounds = [rd for j in positions for rd in ticks[body[j]].sends
                  if rd.remote]
        if not rounds:
          continue
        sec = sum(link.seconds(int(rounds[g[0]].payload.nbytes))
                  for g in flushes.merge_rounds(rounds))
        out.append((body[i - 1] + shift, sec))
  return out


def _interp_flushes(spec: Any, start: int, link: Any
                    ) -> list[tuple[int, float]]:
  """``(tick, seconds)`` of an interp segment starting at ``start``: its
  remote rounds' ``ppermute``s, at the boundaries their ``flush`` tables
  mark (a round without one sends after every tick)."""
  import numpy as np  # pylint: disable=import-outside-toplevel
  out: dict[int, float] = {}
  for rd in spec.sends:
    if not rd.remote:
      continue
    sec = link.seconds(int(rd.payload.nbytes))
    flush = getattr(rd, "flush", None)
    if flush is None:
      boundaries = range(1, int(np.asarray(spec.branch_of).shape[0]) + 1)
    else:
      boundaries = np.flatnonzero(np.asarray(flush).any(axis=-1))
    for f in boundaries:
      if f:  # boundary 0 precedes the first tick: nothing is held yet
        out[start + int(f) - 1] = out.get(start + int(f) - 1, 0.0) + sec
  return sorted(out.items())


def kernel_calls(plan: Any) -> dict[int, tuple[int, ...]]:
  """Step of each tick of ``plan`` -> the kernels each device runs in it
  (0 or 1)."""
  return {t.step: tuple(int(k is not None) for k in t.kernels)
          for t in plan.ticks}


def tick_model(plan: Any, link: Any, costs: TickCosts | None = None,
               rendezvous: bool = False) -> TickModel:
  """The :class:`TickModel` of ``plan``.

  Args:
    plan: The tick plan (``passes.plan_ir.Plan``).
    link: ``LinkModel`` pricing each remote round.
    costs: Measured per-tick costs (None: no per-tick cost).
    rendezvous: Every ``ppermute`` is a rendezvous of all devices (XLA's
      CPU runtime): the remote rounds of a tick become an all-device
      barrier priced with ``link``, placed after the tick, or later where
      XLA runs the following ticks' kernels first (kernels that read only
      micro-batch inputs, inside the same straight run or loop iteration);
      the edge delays then do not apply. Otherwise transfers are the edges'
      delays.
  """
  costs = costs or TickCosts()
  ticks = plan.ticks
  spec_of: dict[int, Any] = {}      # tick index -> interp spec
  for seg in plan.segments:
    if seg.kind == "interp":
      for t in range(seg.start, seg.end):
        spec_of[t] = plan.interps[seg.start]
  tick_costs: dict[int, float] = {}
  device_costs: dict[int, tuple[float, ...]] = {}
  # An interp tick's costs depend on its segment and its kernel per device
  # only: priced once per distinct pair (a ramp repeats a few of them).
  interp_costs: dict[tuple[int, tuple], tuple[float, ...]] = {}
  for t, tick in enumerate(ticks):
    spec = spec_of.get(t)
    if spec is None:
      tick_costs[tick.step] = costs.seconds(tick_traffic(tick),
                                            priced_ports(tick))
      continue
    key = (id(spec), tick.kernels)
    per = interp_costs.get(key)
    if per is None:
      per = interp_costs[key] = tuple(costs.seconds(n, p) for n, p in zip(
          interp_device_traffic(spec, tick, plan),
          interp_device_ports(spec, tick)))
    device_costs[tick.step] = per
    tick_costs[tick.step] = sum(per) / len(per)
  if not rendezvous:
    return TickModel(barriers={}, tick_costs=tick_costs, edge_delays=True,
                     device_costs=device_costs)
  ends, _ = _iteration_ends(plan)

  def pools_read(t: int) -> set[int]:
    return {rp.source for rp in spec_of.get(t, ticks[t]).reads
            if rp.kind == "pool"}

  after: dict[int, float] = {}
  # An interp segment holds its remote messages until a flush boundary
  # (passes.held): nothing is sent before its first tick.
  for t, sec in _deferred_barriers(plan, link):
    # A following kernel runs first only if it reads no stash value at all
    # (micro-batch inputs only): measured, XLA moved such a kernel (the
    # V-shape's F0) ahead of the rendezvous but not one reading the stash
    # even when no message of the rendezvous fed it (the M-shape's F2).
    pos = t
    while pos not in ends and pos + 1 < len(ticks):
      nxt = pos + 1
      if pools_read(nxt):
        break
      pos = nxt
      if _remote_seconds(ticks[nxt], link):
        break
    after[ticks[pos].step] = after.get(ticks[pos].step, 0.0) + sec
  return TickModel(barriers={}, tick_costs=tick_costs, edge_delays=False,
                   barriers_after=after, device_costs=device_costs)


# --- the microbenchmark -------------------------------------------------------


def _tick_program(mesh: Any, axis: str, elems: int, ticks: int
                  ) -> Callable[[], Any]:
  """A compiled loop of ``ticks`` ticks shaped like a lowered tick, with one
  read port, one out port and one gradient port of ``elems`` float32 each;
  returns a function running it once."""
  import jax  # pylint: disable=import-outside-toplevel
  import jax.numpy as jnp  # pylint: disable=import-outside-toplevel
  import numpy as np  # pylint: disable=import-outside-toplevel
  from jax import lax  # pylint: disable=import-outside-toplevel
  from jax.sharding import PartitionSpec as P  # pylint: disable=import-outside-toplevel

  from tessel_jax import compat  # pylint: disable=import-outside-toplevel

  n = int(dict(mesh.shape)[axis])
  slots = 4
  # Devices alternate between running and idling, as in a pipeline.
  table = np.array([[(d + t) % 2 for d in range(n)] for t in range(2)],
                   np.int32)

  def body(pool, acc):
    dev = lax.axis_index(axis)

    def tick(it, carry):
      pool, acc = carry
      x = lax.dynamic_index_in_dim(pool, it % slots, 0, keepdims=False)

      def idle(x):
        return jnp.zeros_like(x), jnp.zeros_like(x)

      def run(x):
        return x * 0.5 + 1.0, x * 0.25

      which = jnp.asarray(table)[it % 2, dev]
      out, grad = lax.switch(which, [idle, run], x)
      pool = lax.dynamic_update_index_in_dim(pool, out, (it + 1) % slots, 0)
      return pool, acc + grad

    return lax.fori_loop(0, ticks, tick, (pool[0], acc[0]))

  amesh = compat.auto_mesh(mesh)
  f = jax.jit(jax.shard_map(
      lambda pool, acc: tuple(v[None] for v in body(pool, acc)), mesh=amesh,
      in_specs=(P(axis), P(axis)), out_specs=(P(axis), P(axis)),
      check_vma=False))
  # Made on the host and placed as the program reads them, once: zeros
  # made by jnp on one device were re-split over the mesh at every call
  # (16 MiB of big ports: 20-22 ms a call against 12-17 ms placed, counted
  # as tick traffic) and cost a compile each.
  sharding = jax.sharding.NamedSharding(amesh, P(axis))
  pool = jax.device_put(np.zeros((n, slots, elems), np.float32), sharding)
  acc = jax.device_put(np.zeros((n, elems), np.float32), sharding)
  compiled = f.lower(pool, acc).compile()
  return lambda: compiled(pool, acc)


#: Elements of each port of the microbenchmark's small tick.
_SMALL_ELEMS = 8


def tick_program_key(mesh: Any, axis: str, elems: int, ticks: int) -> str:
  """The background-compile key (``compile_pool.BACKGROUND``) of
  :func:`_tick_program` ``(mesh, axis, elems, ticks)``."""
  ids = tuple(int(d.id) for d in mesh.devices.flat)
  return (f"ticks:{ids}:{tuple(mesh.axis_names)}:{mesh.devices.shape}:"
          f"{axis}:{elems}:{ticks}")


def prefetch_tick_programs(mesh: Any, axis: str = "pipe", *,
                           big_elems: int = 1 << 18, ticks: int = 256
                           ) -> list[str]:
  """Compiles :func:`measure_tick_costs`' two programs (same arguments) on
  the background compile thread, for it to take; returns their keys."""
  keys = []
  for elems, n in _program_sizes(big_elems, ticks):
    key = tick_program_key(mesh, axis, elems, n)
    _compile_pool.BACKGROUND.call(
        key, functools.partial(_tick_program, mesh, axis, elems, n))
    keys.append(key)
  return keys


def _program_sizes(big_elems: int, ticks: int) -> tuple[tuple[int, int], ...]:
  """``(elems, ticks)`` of :func:`measure_tick_costs`' small and big
  programs."""
  return ((_SMALL_ELEMS, ticks), (big_elems, max(16, ticks // 8)))


def _tick_runner(mesh: Any, axis: str, elems: int, ticks: int
                 ) -> Callable[[], Any]:
  """:func:`_tick_program`, compiled ahead (:func:`prefetch_tick_programs`)
  where it was, else here."""
  ahead = _compile_pool.BACKGROUND.take_call(
      tick_program_key(mesh, axis, elems, ticks))
  return ahead if ahead is not None else _tick_program(mesh, axis, elems,
                                                       ticks)


def _seconds_per_tick(run: Callable[[], Any], ticks: int,
                      repeats: int, devices: int | None = None) -> float:
  """Median wall seconds per tick of ``run``; with ``devices`` (the CPU
  backend) the process's CPU seconds per tick and device instead."""
  import jax  # pylint: disable=import-outside-toplevel
  _compile_pool.drain()  # no background compile while timing
  jax.block_until_ready(run())
  samples = []
  for _ in range(repeats):
    c0, t0 = time.process_time(), time.perf_counter()
    jax.block_until_ready(run())
    if devices:
      samples.append((time.process_time() - c0) / (ticks * devices))
    else:
      samples.append((time.perf_counter() - t0) / ticks)
  return statistics.median(samples)


def measure_tick_costs(mesh: Any, axis: str = "pipe", *,
                       big_elems: int = 1 << 18, ticks: int = 256,
                       repeats: int = 5, rounds: int = 3) -> TickCosts:
  """Measures :class:`TickCosts` on ``mesh`` (every device of ``axis``).

  A ``fori_loop`` of ticks like the lowering's: read a stash slot, a
  two-branch switch (run or idle) returning an out port and a gradient
  port, write the out port into the stash, add the gradient port to an
  accumulator; once with tiny ports (``fixed_s``), once with ``big_elems``
  float32 ports (``per_byte_s``: the difference over the tick's traffic,
  counted as in :func:`tick_traffic`: a read copy, two materialised ports,
  a stash write and an accumulation). Each figure is the median over
  ``rounds`` alternating measurements of ``repeats`` samples each (the
  machine may be shared).

  On the CPU backend the figures are core-seconds of one device: the
  process's CPU time over the ticks and the mesh's devices (each fake
  device runs its ticks on one thread; the toy has no collective, so no
  thread waits). The wall time counted every device sharing the cores,
  which the replay (``predict.predict_shared``) counts again: 4 devices
  on 2 cores paid twice their ticks, and on a loaded machine the wall
  figure of 1 MiB ports was 5-7x the CPU one (2.2 ms against 0.3 ms per
  tick, load 12). ``CostModel.predict`` scales them by the devices of one
  stage.
  """
  sizes = _program_sizes(big_elems, ticks)
  big_ticks = sizes[1][1]
  small_run, big_run = (_tick_runner(mesh, axis, e, n) for e, n in sizes)
  traffic = (COPY + 2 * MATERIALISE + COPY + ACCUMULATE) * 4 * big_elems
  on_cpu = mesh.devices.flat[0].platform in RENDEZVOUS_BACKENDS
  devices = int(mesh.devices.size) if on_cpu else None
  fixed, per_byte = [], []
  for _ in range(rounds):
    small = _seconds_per_tick(small_run, ticks, repeats, devices)
    big = _seconds_per_tick(big_run, big_ticks, repeats, devices)
    fixed.append(small)
    per_byte.append(max(0.0, big - small) / traffic)
  return TickCosts(fixed_s=statistics.median(fixed),
                   per_byte_s=statistics.median(per_byte), source="measured")


def cached_tick_costs(mesh: Any, axis: str, cache: Any,
                      key_fields: Mapping[str, Any],
                      measure: Callable[[], TickCosts] | None = None
                      ) -> TickCosts:
  """:func:`measure_tick_costs` through the on-disk cache."""
  key = tick_cache_key(key_fields)
  rec = cache.get("ticks", key)
  if rec is not None:
    return TickCosts(rec["fixed_s"], rec["per_byte_s"], "measured")
  got = (measure or (lambda: measure_tick_costs(mesh, axis)))()
  cache.put("ticks", key, got.to_dict())
  return got


def tick_cache_key(key_fields: Mapping[str, Any]) -> str:
  """The on-disk cache key (kind ``"ticks"``) of the tick costs measured on
  the machine ``key_fields`` describes."""
  from tessel_jax.cost.cache import make_key  # pylint: disable=import-outside-toplevel
  return make_key({"what": "ticks", "version": TICKS_VERSION, **key_fields})
