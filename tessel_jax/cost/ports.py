"""What a lowered program pays per port operation, measured once per machine.

The prediction from the kernels' profiles and the tick microbenchmark
(``ticks.measure_tick_costs``: a toy tick of one port of each kind) missed
much of what the lowered programs of the model zoo paid (JAX 0.10.2, 2 CPU
devices, ``vshape(2)``, N = 8: they ran 1.4-1.9x their prediction). Timing
each program with its kernels stood in for (``calibrate.standin_plan``: no
kernel work left) shows what the program pays around its kernels: 0.64-1.07
us per *port operation* of the step (``ticks.tick_ports`` summed over the
ticks: 521 for eqx_mlp, 2,161-4,748 for the transformers) above the tick
model on the five zoo models (load 6-9), 0.3-0.6 us on a batch-norm CNN
(1,098-1,166, load 12-13), where the gap per tick varied 10x (22-230 us)
and a toy tick of 1-32 ports gives 0.22 us per port operation. Each
port is several small XLA operations (the slot index from the device's
table, a dynamic slice or update, a select among candidates, the branch's
port), fused into a few thunks of XLA's CPU runtime each.

So a measured prediction prices ``per_port_s`` seconds per port operation
on every device at every tick (``TickCosts.per_port_s``), and every tick
as :data:`TICK_PORTS` more port operations (its fixed cost), measured once per
machine (backend, device kind, mesh size, XLA flags, cores) on the first
plan built there: its stand-in program compiled and timed
(``calibrate.time_step``), ``per_port_s`` solved so that the prediction of
its ticks with zero-time kernels equals it less the part of the step
serial with the ticks (packing, unpacking, FSDP collectives, which every
prediction adds apart: ``cost.port_pricing``; :func:`solve`), cached on
disk (kind ``"ports"``). Every later plan and model on that machine uses
it.

Not every plan measures it: where the stand-in's time is not in its ports
the solve gives nonsense, 0 where the tick model's per-byte term already
over-prices the ticks (ports of tens of KiB: the README GPT) and 103 us
where the ticks move parameter-sized gradients (ResNet18, 11.7M
parameters: stand-in 306 ms against 45 ms predicted). So only a plan of small ports
measures the machine (:func:`is_reference`: at most
``MAX_REFERENCE_BYTES_PER_PORT`` of tick traffic per port operation; the zoo
and the CNN move 1.2-9.9 KB per port op, the README GPT 77 KB, ResNet18
455 KB), and a result outside ``(0, MAX_PER_PORT_S]`` is not stored as the
machine's figure either: that plan is remembered (kind ``"portsplan"``) so
that it is not timed again, and the next plan built on the machine tries.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from tessel_jax.cost import ticks

#: Bump when the port count or what the terms cover changes (5: solved
#: over ticks priced in one device's core-seconds; an interp tick priced
#: per device, with its own kernels' ports and its segment's rounds; 6:
#: every tick also pays :data:`TICK_PORTS`; 7: the stand-in's serial part,
#: packing, unpacking and FSDP collectives, taken off before the solve:
#: every prediction adds it itself, ``cost.port_pricing``).
PORTS_VERSION = 7
#: Port operations' worth of fixed cost every tick pays on every device
#: beyond its own ports (the tick loop's step, its table lookups, the
#: kernels' 0/1-trip loop conditions), priced at the machine's per-port
#: figure (``ticks.TickCosts.tick_ports``). Fitted on the stand-ins of the
#: five zoo models and the batch-norm CNN, timed interleaved in one process
#: (load 14.5, 2 devices, ``vshape(2)``, N = 8, 25 ticks): the seconds per
#: port each stand-in implies fell with its ports per tick, 1.96 us at 18
#: (eqx_mlp) to 1.01-1.18 us at 107-172 (the transformers), 1.45 us for
#: the CNN at 45; a fixed cost per tick worth 21 ports (least squares)
#: plus ~0.97 us per port fits all six within 16% of their program around
#: the kernels, where one per-port figure missed by -26% to +44%.
TICK_PORTS = 20.0
#: Largest seconds per port operation taken as a machine's figure: twice
#: the largest measured on the model zoo (1.07 us, load 6-9).
MAX_PER_PORT_S = 2e-6
#: Largest tick traffic per port operation (``ticks.tick_traffic`` over
#: ``ticks.tick_ports``, summed over the ticks) of a reference plan.
MAX_REFERENCE_BYTES_PER_PORT = 32 * 1024


def is_reference(plan: Any) -> bool:
  """Whether ``plan``'s stand-in may measure the machine's per-port cost:
  its ticks' time is in their port operations, not their bytes."""
  n = sum(ticks.tick_ports(t) for t in plan.ticks)
  traffic = sum(ticks.tick_traffic(t) for t in plan.ticks)
  return n > 0 and traffic <= MAX_REFERENCE_BYTES_PER_PORT * n


def port_key(fields: Mapping[str, Any]) -> str:
  """Cache key of the per-machine record (``fields``: the mesh and
  backend facts, ``CostModel._mesh_fields``)."""
  from tessel_jax.cost.cache import make_key  # pylint: disable=import-outside-toplevel
  return make_key({"what": "ports", "version": PORTS_VERSION, **fields})


def solve(target: float, replay: Callable[[float], float], at: float,
          probe: float) -> float:
  """``x >= at`` where ``replay(x)`` (increasing, about linear) equals
  ``target``; ``at`` where ``replay(at)`` already reaches it.

  One secant step from ``at`` over ``probe``, corrected once where the
  shared-core replay bends.
  """
  base = replay(at)
  if target <= base:
    return at
  slope = (replay(at + probe) - base) / probe
  if slope <= 0:
    return at
  x = at + (target - base) / slope
  got = replay(x)
  if abs(got - target) > 0.01 * target and got > base:
    x = at + (x - at) * (target - base) / (got - base)
  return max(at, x)


def cached_terms(cache: Any, fields: Mapping[str, Any],
                 measure: Callable[[], dict[str, Any]] | None,
                 plan_key: str | None = None
                 ) -> tuple[dict[str, Any] | None, bool]:
  """``(record, from the cache?)`` of the machine.

  None when not cached and ``measure`` is None, when the plan of
  ``plan_key`` was measured before and is no reference, or when
  ``measure()`` (the record to store: ``per_port_s``, ``standin_s`` and
  what they were measured on) gives a figure outside
  ``(0, MAX_PER_PORT_S]``; that plan is then remembered under
  ``plan_key`` (kind ``"portsplan"``).
  """
  key = port_key(fields)
  rec = cache.get("ports", key)
  if rec is not None:
    return rec, True
  if measure is None or (plan_key is not None and
                         cache.get("portsplan", plan_key) is not None):
    return None, False
  rec = measure()
  if 0.0 < float(rec["per_port_s"]) <= MAX_PER_PORT_S:
    cache.put("ports", key, rec)
    return rec, False
  if plan_key is not None:
    cache.put("portsplan", plan_key, rec)
  return None, False
