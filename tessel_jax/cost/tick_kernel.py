"""A kernel as a tick runs it: its parameter-only values given as inputs.

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
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import jax

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
