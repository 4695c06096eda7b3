"""Cache keys of profiled kernels (``cost.measure``'s records).

A kernel's key (:func:`kernel_key`) is what decides its measurement: its
work (its forward block's printed jaxpr plus the kernel's structure, or
the kernel traced alone), its shapes, the backend and device kind, JAX's
version, the XLA flags that change speed and the cores a CPU process has.
Two kernels doing the same work on the same shapes (identical layers)
share a key, so one measurement, in memory and on disk
(:class:`tessel_jax.cost.cache.ProfileCache`).
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Sequence
from typing import Any

import jax
import numpy as np

from tessel_jax import compat
from tessel_jax.cost import fused_grads as _fused_grads
from tessel_jax.cost.cache import make_key
from tessel_jax.cost.call_timing import cpu_cores
from tessel_jax.cost.flops import jaxpr_flops

#: Bump when what a kernel's record measures changes (old records are then
#: not read). 2: the per-array call overhead taken off
#: (``call_timing.call_overhead``). 3: timed as the ticks run it, inside a
#: ``lax.cond`` branch and, where the lowering hoists, without its
#: parameter-only work (``cost.tick_kernel``). 4: nor, there, the work on
#: its captured constants alone (``param_only.find(constants=True)``).
PROFILE_VERSION = 4


def _aval_list(avals: Sequence[Any]) -> list[list[Any]]:
  return [[list(int(s) for s in a.shape), np.dtype(a.dtype).name]
          for a in avals]


def speed_flags() -> str:
  """XLA flags that change speed (the fake device count does not), each
  once: a flag given twice acts once."""
  flags = os.environ.get("XLA_FLAGS", "").split()
  keep = {f for f in flags
          if not f.startswith("--xla_force_host_platform_device_count")}
  return " ".join(sorted(keep))


def kernel_callable(kernel: Any) -> Callable[[Any, Any], Any]:
  """``f(pvals, dvals) -> (outputs, grads)`` running ``kernel`` alone."""
  def run(pvals, dvals):
    outs, grads = kernel.fn({"row_offset": 0}, list(pvals), list(dvals))
    return list(outs), list(grads)
  return run


def kernel_avals(kernel: Any, param_avals: Sequence[Any]
                 ) -> tuple[list[jax.ShapeDtypeStruct], list[jax.ShapeDtypeStruct]]:
  """Full-shaped parameter avals and local input avals of ``kernel``."""
  p = [jax.ShapeDtypeStruct(tuple(param_avals[l].shape), param_avals[l].dtype)
       for l in kernel.params]
  d = [jax.ShapeDtypeStruct(tuple(a.shape), a.dtype) for a in kernel.in_avals]
  return p, d


def kernel_flops(kernel: Any, param_avals: Sequence[Any]) -> float | None:
  """Flops of ``kernel`` alone, counted on its jaxpr (traced, neither
  lowered nor compiled; ``cost.flops.jaxpr_flops``, as the measured
  records count theirs on the traced tick kernel: within 0.5% of XLA's
  cost analysis on the README GPT's kernels above 10 kflops)."""
  p, d = kernel_avals(kernel, param_avals)
  return jaxpr_flops(jax.make_jaxpr(kernel_callable(kernel))(p, d))


def _structure(kernel: Any) -> list[Any]:
  """What, beyond its forward block, decides a kernel's work."""
  return [kernel.kind, kernel.split,
          [kernel.params.index(l) for l in kernel.grads],
          [[r.kind, r.key[0] if r.key else ""] for r in kernel.inputs],
          [k[0] for k in kernel.outputs], list(kernel.in_split),
          list(kernel.out_split), _aval_list(kernel.out_avals)] + (
              [list(kernel.rewrites)] if getattr(kernel, "rewrites", ())
              else [])


def kernel_key(kernel: Any, param_avals: Sequence[Any], device: Any,
               block: Any = None, stage: Any = None,
               hoist: bool = False) -> str:
  """Cache key: (jaxpr text, shapes, backend, device kind, JAX, XLA flags).

  With ``block`` (the kernel's ``passes.partition.ForwardBlock``) the text
  is the block's jaxpr plus the kernel's structure (kind, inputs, outputs,
  split, gradients: a backward is the vjp of its block); without it the
  kernel is traced alone (slower: a vjp trace per kernel). Either way two
  kernels doing the same work on the same shapes (identical layers) share
  a key. With ``stage`` (a ``cost.stage.Stage``) the stage's axes and the
  specs of the kernel's parameters join the key. ``hoist``: the kernel is
  timed with its parameter-only values given (:func:`lower_kernel`).
  """
  p, d = kernel_avals(kernel, param_avals)
  if block is not None:
    text = "block:" + _block_text(block) + repr(_structure(kernel))
  else:
    text = compat.plain_text(jax.make_jaxpr(kernel_callable(kernel))(p, d))
  # Variable names are positional; drop memory addresses that some reprs
  # carry so equal programs give equal text.
  text = re.sub(r" at 0x[0-9a-f]+", "", text)
  cores = cpu_cores() if device.platform == "cpu" else None
  extra = {"stage": stage.key(kernel.params)} if stage is not None else {}
  if hoist:
    extra["hoist"] = True
  if _fused_grads.applies(kernel, stage):
    extra["fused_grads"] = True
  return make_key({
      **extra,
      "what": "kernel",
      "profile_version": PROFILE_VERSION,
      "jaxpr": text,
      "params": _aval_list(p),
      "inputs": _aval_list(d),
      "backend": device.platform,
      "device_kind": device.device_kind,
      "jax": jax.__version__,
      "xla_flags": speed_flags(),
      "cpu_cores": cores,
  })


#: Printed jaxprs of forward blocks, by ``id`` (with the block, so the id
#: is not reused while kept): a block's forward and backward kernels, and
#: the same partition's kernels profiled again (``placement="auto"``'s
#: screening and full builds), print it once. At most
#: :data:`BLOCK_TEXTS_KEPT`, oldest dropped first.
_BLOCK_TEXTS: dict[int, tuple[Any, str]] = {}
BLOCK_TEXTS_KEPT = 256


def _block_text(block: Any) -> str:
  """``block``'s printed jaxpr (its equations, inputs and constants in,
  outputs out), printed once per block object."""
  kept = _BLOCK_TEXTS.get(id(block))
  if kept is not None and kept[0] is block:
    return kept[1]
  text = compat.jaxpr_text(block.eqns,
                           tuple(block.invars) + tuple(block.const_vars),
                           block.outvars)
  if BLOCK_TEXTS_KEPT <= 0:
    return text
  while len(_BLOCK_TEXTS) >= BLOCK_TEXTS_KEPT:
    _BLOCK_TEXTS.pop(next(iter(_BLOCK_TEXTS)))
  _BLOCK_TEXTS[id(block)] = (block, text)
  return text
