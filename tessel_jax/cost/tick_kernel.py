"""A kernel as a tick runs it: in a branch, its parameter-only values given.

Inside the lowered program ``passes.hoist`` computes a kernel's
parameter-only values (``passes.param_only.find``: weight transposes a
matmul reads, a tied embedding's transpose, a conv kernel's ``rev``) once
per step before the ticks, and every tick runs the rest of the kernel with
them given (``passes.hoist.run``). A kernel compiled alone recomputes
them at every call, so its profile priced work the program does not do per
run (the automatic cut already prices it at 0: ``passes.autocut``).

:func:`tick_callable` gives ``cost.measure`` the kernel in the program's
form: ``f(pvals, dvals + hvals + [flag])`` running ``param_only.rest``
on the kernel's one trace (the hoisted values' producers left out; with
nothing hoisted, every equation), with :func:`example_inputs` the extra
inputs to time it on (example values, as for the kernel's own inputs).
The prelude itself (once per step) is not priced here. Where the kernel
draws random bits from its captured constants alone, that work is left
out too (``param_only.find`` with ``constants=True``): XLA moves it out
of the tick loop although the lowering does not hoist it
(nnx_transformer's dropout masks, drawn from the module's constant key:
its forwards were priced 1.4x their time in the program with them).
Other work on constants alone XLA folds at compile time, alone as in the
program: it is left in.

The ticks run every kernel inside a ``conditional`` branch or a ``while``
body, never at the top of a program, and XLA's CPU backend compiles a
nested computation differently: a weight-gradient convolution there keeps
its ``f01b_i01o->01bf`` form (the slow generic loop) where at the top it
is transposed to ``b01f_01io->b01f`` (Eigen's kernel). The batch-norm
CNN's backward kernels ran 2.3-2.8x slower in a branch than alone, the
transformers' kernels 1.0-1.16x (helper zoo11, session 35), and zoo10
found the CNN's kernels 2-2.7x slower in the program than profiled.
The callable runs the kernel in the taken branch of a ``lax.cond`` on a
runtime flag (its last input) so it is compiled as the ticks run it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from tessel_jax import compat
from tessel_jax.cost.call_timing import example_array

try:  # installed: passes/ is tessel_jax.passes
  from tessel_jax.passes import param_only as _po  # type: ignore
except ImportError:  # run from the repository root
  from passes import param_only as _po  # type: ignore


def traced(kernel: Any, p: Sequence[Any], d: Sequence[Any],
           hoist: bool) -> Any:
  """``kernel`` traced once on avals ``p`` (parameters) and ``d``
  (inputs), row offset 0: its ``param_only.Found``, with nothing hoisted
  unless ``hoist``."""
  closed, _ = compat.make_jaxpr(
      lambda pv, dv: kernel.fn({"row_offset": 0}, list(pv), list(dv)),
      list(p), list(d))
  invars, _ = compat.jaxpr_io(closed)
  f = _po.find(closed, invars[:len(p)])
  if hoist:
    # Work on constants alone that XLA folds costs nothing either way; a
    # draw it cannot fold, it moves out of the tick loop: leave it out.
    c = _po.find(closed, invars[:len(p)], constants=True)
    return c if _po.draws(c) else f
  return dataclasses.replace(f, hoisted=(), prelude=(), stored=(),
                             rewrites={}, signature=())


def tick_callable(f: Any, num_inputs: int, grads: int = 0,
                  work: bool = True) -> Callable[[Any, Any], Any]:
  """``g(pvals, dvals + hvals + accs + [flag])``: the kernel's flat outputs
  and gradients, its hoisted values (of ``f``, :func:`traced`) given after
  its ``num_inputs`` inputs, run in the taken branch of a ``lax.cond`` on
  ``flag`` (an int32 scalar, 1 when timed; the other branch gives zeros).

  With ``grads`` (``cost.fused_grads``) its last ``grads`` outputs, the
  parameter gradients, are added into as many accumulators ``accs`` given
  before the flag, as the ticks add them (``passes.predicated``: there XLA
  fuses a gradient's final reduction into its accumulation). Without
  ``work`` the branch runs the adds alone (each accumulator added to
  itself) and gives zeros for the other outputs: the same call, inputs and
  outputs without the kernel's work.
  """
  _, outvars = compat.jaxpr_io(f.closed)
  avals = [(tuple(v.aval.shape), v.aval.dtype) for v in outvars]
  cut = len(avals) - grads

  def run(pvals: Any, dvals: Any) -> Any:
    dvals = list(dvals)
    end = len(dvals) - 1 - grads
    flag, hvals, accs = dvals[-1], dvals[num_inputs:end], dvals[end:-1]
    args = list(pvals) + dvals[:num_inputs]
    zeros = lambda: [jnp.zeros(s, t) for s, t in avals]

    def taken() -> list[Any]:
      if not work:
        return zeros()[:cut] + [a + a for a in accs]
      outs = list(_po.rest(f, args, hvals))
      return outs[:cut] + [a + g for a, g in zip(accs, outs[cut:])]

    return jax.lax.cond(flag > 0, taken, zeros)

  return run


def accumulators(f: Any, grads: int, device: Any,
                 rng: np.random.Generator) -> list[Any]:
  """Example accumulators of the last ``grads`` outputs of ``f`` on
  ``device`` (:func:`tick_callable`)."""
  if not grads:
    return []
  _, outvars = compat.jaxpr_io(f.closed)
  return [jax.device_put(example_array(v.aval, rng), device)
          for v in list(outvars)[-grads:]]


def example_inputs(f: Any, p: Sequence[Any], device: Any,
                   rng: np.random.Generator) -> list[Any]:
  """What :func:`tick_callable` takes after the kernel's inputs, on
  ``device``: example hoisted values (their avals from an abstract run of
  the prelude, stored as ``passes.hoist`` stores them) and the flag 1."""
  hvals = []
  if f.hoisted:
    shapes = jax.eval_shape(lambda pv: _po.prelude(f, pv), list(p))
    if all(isinstance(a.dtype, np.dtype) for a in shapes):
      hvals = [jax.device_put(example_array(a, rng), device) for a in shapes]
    else:  # a PRNG key among them: no example value, compute them
      pv = [example_array(a, rng) for a in p]
      hvals = [jax.device_put(x, device) for x in _po.prelude(f, pv)]
  return hvals + [jax.device_put(np.int32(1), device)]
