"""A kernel as a tick runs it: in a branch, its parameter-only values given.

Inside the lowered program ``passes.hoist`` computes a kernel's
parameter-only values (``passes.param_only.find``: weight transposes a
matmul reads, a tied embedding's transpose, a conv kernel's ``rev``) once
per step before the ticks, and every tick runs the rest of the kernel with
them given (``passes.hoist.run``). A kernel compiled alone recomputes
them at every call, so its profile priced work the program does not do per
run (the automatic cut already prices it at 0: ``passes.autocut``).

:func:`tick_callable` gives ``cost.measure`` the kernel in the program's
form: ``f(pvals, dvals + hvals)`` running ``param_only.rest`` (the
hoisted values' producers left out), with :func:`hoisted_values` the
values to time it on. A kernel with nothing to hoist keeps its plain
callable. The prelude itself (once per step) is not priced here.

The ticks run every kernel inside a ``conditional`` branch or a ``while``
body, never at the top of a program, and XLA's CPU backend compiles a
nested computation differently: a weight-gradient convolution there keeps
its ``f01b_i01o->01bf`` form (the slow generic loop) where at the top it
is transposed to ``b01f_01io->b01f`` (Eigen's kernel). The batch-norm
CNN's backward kernels ran 2.3-2.8x slower in a branch than alone, the
transformers' kernels 1.0-1.16x (helper zoo11, session 35), and zoo10
found the CNN's kernels 2-2.7x slower in the program than profiled.
:func:`in_branch` wraps a kernel in a ``lax.cond`` on a runtime flag (the
last input, :func:`branch_flag`) so it is compiled as the ticks run it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from tessel_jax import compat

try:  # installed: passes/ is tessel_jax.passes
  from tessel_jax.passes import param_only as _po  # type: ignore
except ImportError:  # run from the repository root
  from passes import param_only as _po  # type: ignore


def found(kernel: Any, p: Sequence[Any], d: Sequence[Any]) -> Any:
  """``param_only.Found`` of ``kernel`` traced on avals ``p`` (parameters)
  and ``d`` (inputs) with row offset 0, or None when it hoists nothing."""
  closed, _ = compat.make_jaxpr(
      lambda pv, dv: kernel.fn({"row_offset": 0}, list(pv), list(dv)),
      list(p), list(d))
  invars, _ = compat.jaxpr_io(closed)
  out = _po.find(closed, invars[:len(p)])
  return out if out.hoisted else None


def tick_callable(f: Any, num_inputs: int) -> Callable[[Any, Any], Any]:
  """``g(pvals, dvals + hvals)``: the kernel's flat outputs and gradients
  with the hoisted values of ``f`` (:func:`found`) given after its
  ``num_inputs`` inputs."""

  def run(pvals: Any, dvals: Any) -> Any:
    dvals = list(dvals)
    return _po.rest(f, list(pvals) + dvals[:num_inputs],
                    dvals[num_inputs:])

  return run


def hoisted_values(f: Any, pvals: Sequence[Any], device: Any) -> list[Any]:
  """The hoisted values of ``f`` computed from ``pvals`` on ``device``
  (as ``passes.hoist.prepare`` stores them)."""
  vals = jax.jit(lambda pv: _po.prelude(f, pv))(list(pvals))
  return [jax.device_put(v, device) for v in vals]


def in_branch(fn: Callable[[Any, Any], Any]) -> Callable[[Any, Any], Any]:
  """``g(pvals, dvals + [flag])``: ``fn(pvals, dvals)`` run inside the
  taken branch of a ``lax.cond`` on ``flag`` (an int32 scalar, 1 when
  timed; the other branch gives zeros)."""

  def run(pvals: Any, dvals: Any) -> Any:
    dvals = list(dvals)
    flag, dvals = dvals[-1], dvals[:-1]
    shapes = jax.eval_shape(fn, pvals, dvals)
    zeros = lambda: jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype),
                                 shapes)
    return jax.lax.cond(flag > 0, lambda: fn(pvals, dvals), zeros)

  return run


def branch_flag(device: Any) -> Any:
  """The flag :func:`in_branch` takes: 1 (the kernel's branch), on
  ``device``."""
  return jax.device_put(np.int32(1), device)
