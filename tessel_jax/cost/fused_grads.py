"""A backward kernel priced net of the gradient adds it fuses with.

Inside the lowered program a kernel with parameter gradients adds them into
their accumulators in the same branch (``passes.predicated``), and XLA
fuses a gradient's final reduction into that add: one thunk where the
kernel compiled alone runs two. The stand-in program (``calibrate``) runs
the same adds without the kernel's work and prices them per gradient port
(``ticks.GRAD_PORTS``). So the profile of such a kernel alone priced the
reductions as thunks of their own that the program does not run: hf_gpt2's
and nnx_transformer's backwards ran 31-61 more thunks alone than per call
in the program and were profiled 1.3-2.0x their time there (helper zoo15,
session 39).

With the switch :data:`ENV` on, such a kernel (one device, not a
tensor-parallel stage) is compiled with its gradients added into
accumulators given as inputs (``tick_kernel.tick_callable(grads=)``), and
also as its *twin*: the same call, inputs and outputs with only the adds
run (``work=False``). Its figure is the first's time less the twin's
(:func:`net_seconds`): what the kernel adds over the adds the stand-in
already pays, with the call's overhead cancelled by the twin rather than
taken off by ``call_timing.call_overhead``.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import Any

import jax

from tessel_jax.cost import tick_kernel as _tick_kernel
from tessel_jax.cost.call_timing import restricted_cores, time_calls

#: ``TESSEL_JAX_FUSED_GRADS=1`` prices backward kernels net of their fused
#: gradient adds (off by default: see BENCHMARKS.md, helper zoo16).
ENV = "TESSEL_JAX_FUSED_GRADS"
#: The net figure is never below this share of the kernel's raw time.
FLOOR = 0.05


def enabled(environ: Mapping[str, str] | None = None) -> bool:
  """Whether :data:`ENV` turns the fused-gradient pricing on."""
  env = os.environ if environ is None else environ
  return env.get(ENV, "0") not in ("", "0")


def applies(kernel: Any, stage: Any = None,
            environ: Mapping[str, str] | None = None) -> bool:
  """Whether ``kernel`` is profiled net of its gradient adds: the switch
  on, a kernel with parameter gradients, profiled on one device."""
  return enabled(environ) and stage is None and bool(kernel.grads)


def net_seconds(raw_s: float, adds_s: float) -> float:
  """The kernel's seconds: its raw time with the adds (``raw_s``) less its
  twin's (``adds_s``), never below :data:`FLOOR` of ``raw_s``."""
  return max(raw_s - adds_s, FLOOR * raw_s)


def twin(kernel: Any, p: Sequence[Any], d: Sequence[Any], hoist: bool,
         pv: Any, dv: Any) -> Any:
  """The compiled twin of ``kernel`` (avals ``p``, ``d``): the adds alone,
  on the same example values ``pv``, ``dv`` as the kernel's own program."""
  f = _tick_kernel.traced(kernel, p, d, hoist)
  fn = _tick_kernel.tick_callable(f, len(d), len(kernel.grads), work=False)
  return jax.jit(fn).lower(pv, dv).compile()


def timed(compiled: Any, adds: Any, pv: Any, dv: Any, repeats: int,
          warmup: int, cores: int | None, rounds: int
          ) -> tuple[float, float, float]:
  """``(net seconds, raw seconds, the twin's raw seconds)``: ``compiled``
  (the kernel with its adds) and ``adds`` (its twin) timed in alternation,
  ``rounds`` times each (a round: the median of ``repeats``); the smallest
  round of each kept."""
  with restricted_cores(cores):
    one_core = cores == 1
    raws, twins = [], []
    for _ in range(max(1, rounds)):
      raws.append(time_calls(lambda: compiled(pv, dv), repeats, warmup,
                             cpu_clock=one_core)[0])
      twins.append(time_calls(lambda: adds(pv, dv), repeats, warmup,
                              cpu_clock=one_core)[0])
  raw, base = min(raws), min(twins)
  return net_seconds(raw, base), raw, base
