"""A kernel as the lowered program runs it: many runs inside one loop.

Timed alone as a whole jitted executable, a kernel's call also pays what
the pipelined program never pays per run: the dispatch, one host buffer
and one ``jax.Array`` per input and output, output allocation and the
thread's wake-up. Measured on the model zoo (JAX 0.10.2, one CPU core):
eqx_transformer's forward kernels took 0.31 ms per call alone and
0.10-0.12 ms per run inside a loop, with most of that spent writing their
~50 residual outputs; the zoo's transformers were over-predicted 1.3-1.5x.

:func:`looped` runs a kernel ``runs`` times inside one ``lax.fori_loop``
(how the program runs it: inside its tick loop), each run on its own fresh
operands (dynamic reads from stacked inputs, as the program reads its
stash), its outputs written into stacked buffers and its gradients added
into accumulators (as the program writes its stash and accumulates its
gradients); ``cost.measure.time_kernel`` times it and divides by the runs.

Why not less the same loop around the kernel's stand-in
(``cost.calibrate.standin_fn``, outputs filled with one value), as
``cost.ports`` is fitted? The kernel's fusions write its outputs in place,
so the stand-in's writes are not work the real loop does on top of its
compute: so measured, the zoo transformers' kernels came to 0.49-0.57x
their own thunk time in the program (``experiments.model_zoo_kernels``),
the whole loop per run to 0.85-1.20x.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
from jax import lax

Run = Callable[[Sequence[Any], Sequence[Any]], tuple[list[Any], list[Any]]]


def looped(run: Run, runs: int) -> Callable[[Any, Any], Any]:
  """``f(pvals, stacked) -> (stacked outputs, gradient sums)``: ``run``
  (``run(pvals, dvals) -> (outs, grads)``) once per leading index of the
  stacked inputs, inside one ``fori_loop`` of ``runs`` trips."""

  def program(pvals: Sequence[Any], stacked: Sequence[Any]) -> Any:
    pvals = list(pvals)
    first = [jax.ShapeDtypeStruct(x.shape[1:], x.dtype) for x in stacked]
    outs0, grads0 = jax.eval_shape(run, pvals, first)

    def body(i: Any, carry: Any) -> Any:
      bufs, sums = carry
      dvals = [lax.dynamic_index_in_dim(x, i, keepdims=False)
               for x in stacked]
      outs, grads = run(pvals, dvals)
      bufs = [lax.dynamic_update_index_in_dim(b, o, i, 0)
              for b, o in zip(bufs, outs)]
      return bufs, [s + g for s, g in zip(sums, grads)]

    init = ([jnp.zeros((runs,) + tuple(o.shape), o.dtype) for o in outs0],
            [jnp.zeros(g.shape, g.dtype) for g in grads0])
    return lax.fori_loop(0, runs, body, init)

  return program
