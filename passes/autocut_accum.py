"""The gradient accumulation a cut puts on each device, priced per equation.

Every micro-batch, the device running a block adds the block's parameter
gradients into their accumulators (``passes.param_grads``, inside the
kernel's branch): it reads the gradient and the accumulator and writes the
accumulator, three passes over the gradient's bytes, memory bound. The cut's
equation costs (``autocut.eqn_costs``) time or estimate the kernels alone;
a device holding most of the parameters (ResNet18's last stages and head:
~10M of 11.7M parameters behind the cut after basic block 3) also spends
~0.5x its kernels' time on these adds (BENCHMARKS.md, helper "resnet11").

:func:`grad_bytes` gives, per top-level equation, the gradient bytes the
block holding it adds per micro-batch, charged to the first equation that
reads each parameter: the whole leaf, or only the box of it that static
slices read (``passes.grad_windows``: a dead-tap convolution's live taps).
:func:`seconds` prices them at :data:`PASSES` passes of a measured
in-place add's rate on the device (:func:`add_seconds_per_byte`, once per
process and platform), or of a given bandwidth.
"""

from __future__ import annotations

import time
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from tessel_jax import compat
from tessel_jax.cost import compile_pool as _compile_pool

from . import grad_windows as _grad_windows

#: Passes over the gradient's bytes per add: read it, read and write the
#: accumulator (the rate of :func:`add_seconds_per_byte` covers all three).
PASSES = 3


def grad_bytes(closed_jaxpr: Any, num_params: int) -> np.ndarray:
  """Per top-level equation: parameter-gradient bytes added per micro-batch.

  Args:
    closed_jaxpr: The (flattened) traced function.
    num_params: Its first ``num_params`` inputs are the parameters.

  Returns:
    ``float`` bytes per equation: each floating parameter's gradient (its
    static-slice box where ``grad_windows.window`` finds one) charged to the
    first equation reading it; parameters nothing reads cost nothing.
  """
  jaxpr = closed_jaxpr.jaxpr
  eqns = jaxpr.eqns
  out = np.zeros(len(eqns))
  for var in jaxpr.invars[:num_params]:
    aval = var.aval
    if not jnp.issubdtype(aval.dtype, jnp.inexact):
      continue
    first = next((i for i, e in enumerate(eqns)
                  if any(v is var for v in e.invars if not
                         compat.is_literal(v))), None)
    if first is None:
      continue
    box = _grad_windows.window(eqns, jaxpr.outvars, var)
    shape = (tuple(b - a for a, b in zip(*box)) if box is not None
             else tuple(aval.shape))
    out[first] += float(np.prod(shape, dtype=np.int64)) * np.dtype(
        aval.dtype).itemsize
  return out


def seconds(nbytes: np.ndarray, device: Any | None = None,
            bandwidth: float | None = None) -> np.ndarray:
  """Seconds of the adds of ``nbytes`` gradient bytes (per equation): at
  ``bandwidth`` bytes/s over :data:`PASSES` passes when given, else at the
  measured in-place add rate of ``device``'s platform."""
  if bandwidth is not None:
    return PASSES * np.asarray(nbytes, float) / bandwidth
  return np.asarray(nbytes, float) * add_seconds_per_byte(device)


def add_seconds_per_byte(device: Any | None = None) -> float:
  """Seconds per gradient byte of ``acc = acc + g`` carried in place
  through a loop (f32, 4 MiB, as the ticks' accumulators are), on
  ``device`` (default: the first device); measured once per platform."""
  dev = device if device is not None else jax.devices()[0]
  platform = str(getattr(dev, "platform", "cpu"))
  if platform not in _RATES:
    _RATES[platform] = _measured_rate(dev)
  return _RATES[platform]


#: Seconds per gradient byte by platform (:func:`add_seconds_per_byte`).
_RATES: dict[str, float] = {}


def _measured_rate(device: Any) -> float:
  """Times ``acc = acc + g`` in place on ``device``."""
  _compile_pool.drain()  # no background compile while timing
  n, trips = 1 << 20, 8
  g = jax.device_put(jnp.ones((n,), jnp.float32), device)

  run = jax.jit(lambda acc, g: jax.lax.fori_loop(
      0, trips, lambda i, a: a + g * (i + 1).astype(a.dtype), acc),
                donate_argnums=0)
  best = float("inf")
  for _ in range(6):
    acc = jax.block_until_ready(
        jax.device_put(jnp.zeros((n,), jnp.float32), device))
    t0 = time.perf_counter()
    jax.block_until_ready(run(acc, g))
    best = min(best, time.perf_counter() - t0)
  return best / (trips * 4.0 * n)


__all__ = ["PASSES", "add_seconds_per_byte", "grad_bytes", "seconds"]
