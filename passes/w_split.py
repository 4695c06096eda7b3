"""A split backward whose weight-gradient part reuses the input-gradient part.

A block's backward split into ``B`` (input cotangents) and ``W`` (parameter
gradients) used to run the whole vjp in both kernels, each pruned by XLA to
what it returns: the work both need (e.g. ``dz = dy * tanh'(z)``, the
cotangent at a weight's dot) ran twice, and ``W`` read every residual and
every output cotangent from the stash.

:func:`find` reads the backward's jaxpr (parameters, stashed residuals and
summed output cotangents in; input cotangents then parameter gradients out)
and splits its equations: ``B`` runs those the input cotangents need,
``W`` those only the gradients need, and every value ``W`` reads that ``B``
computes (a *shared* equation's output or a summed output cotangent) is
handed over: ``B`` returns it, the lowering stashes it until ``W``.

**The rule, per value.** ``W``'s inputs are priced by their bytes
(parameters and constants are free: read in place). ``W`` may recompute
only memory-bound equations (``residual_trim.CHEAP``: elementwise
arithmetic, comparisons, views); every other value ``B`` computes that
``W`` needs (a dot's output, a reduction, a transcendental) is handed
over. Start with every shared value ``W`` needs handed over; then
repeatedly let ``W`` recompute one cheap shared equation whose output it
reads, alone or together with the cheap shared equations it depends on,
where that strictly lowers ``W``'s input bytes (a broadcast of a
parameter: recomputed; the cotangent after an elementwise op: handed over,
as it replaces the output cotangent and the residual it was computed
from). Equal bytes keep the hand-over (fewer flops in ``W``). An equation
holding a sub-program (a loop, a remat, a custom rule's call) is always
recomputed: ``B`` would run the gradient work inside it. **The stash never
grows:** where the result reads more bytes than the old split (``W``
recomputes every shared equation), the old split is kept (the README GPT's
transformer blocks on zbv(4): sharing would read 7% more, so they keep it).
Residuals ``W`` no longer reads leave the stash at ``B``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import numpy as np

from tessel_jax import compat

from . import residual_trim


def _nbytes(v: Any) -> int:
  aval = v.aval
  dtype = np.dtype(aval.dtype)
  if dtype.itemsize == 0 or str(aval.dtype) == "float0":
    return 0
  return int(np.prod(aval.shape, dtype=np.int64)) * dtype.itemsize


@dataclasses.dataclass(frozen=True, eq=False)
class Split:
  """``B``'s and ``W``'s equations of one backward, and what ``B`` hands
  ``W``.

  Attributes:
    params: Parameter invars (kernel parameter order).
    consts: ``(constvar, value)`` pairs of the traced backward.
    residuals: Stashed residual invars.
    bars: Summed output cotangent invars (the block's inexact outputs).
    b_eqns: Equations ``B`` runs (program order).
    w_eqns: Equations ``W`` runs (program order).
    acts: Input cotangent outvars (``B``'s).
    grads: Parameter gradient outvars (``W``'s).
    handoff: Values ``B`` returns for ``W`` (variables).
    w_res: Positions of the residuals ``W`` reads from the stash.
    w_bytes: ``W``'s input bytes (residuals plus hand-over).
    old_bytes: ``W``'s input bytes when it recomputes every shared
      equation (every residual it needs plus the output cotangents).
  """

  params: tuple[Any, ...]
  consts: tuple[tuple[Any, Any], ...]
  residuals: tuple[Any, ...]
  bars: tuple[Any, ...]
  b_eqns: tuple[Any, ...]
  w_eqns: tuple[Any, ...]
  acts: tuple[Any, ...]
  grads: tuple[Any, ...]
  handoff: tuple[Any, ...]
  w_res: tuple[int, ...]
  w_bytes: int
  old_bytes: int

  @property
  def handoff_avals(self) -> tuple[Any, ...]:
    return tuple(v.aval for v in self.handoff)

  def run_b(self, pvals: Sequence[Any], rvals: Sequence[Any],
            bars: Sequence[Any]) -> tuple[list[Any], list[Any]]:
    """``(input cotangents, hand-over values)``."""
    invars = (list(self.params) + [c for c, _ in self.consts]
              + list(self.residuals) + list(self.bars))
    args = (list(pvals) + [x for _, x in self.consts] + list(rvals)
            + list(bars))
    outs = compat.eval_eqns(list(self.b_eqns), invars,
                            list(self.acts) + list(self.handoff), args)
    return outs[:len(self.acts)], outs[len(self.acts):]

  def run_w(self, pvals: Sequence[Any], wres: Sequence[Any],
            handoff: Sequence[Any]) -> list[Any]:
    """Parameter gradients from ``W``'s residuals and the hand-over."""
    invars = (list(self.params) + [c for c, _ in self.consts]
              + [self.residuals[k] for k in self.w_res] + list(self.handoff))
    args = (list(pvals) + [x for _, x in self.consts] + list(wres)
            + list(handoff))
    return compat.eval_eqns(list(self.w_eqns), invars, list(self.grads), args)


class _Graph:
  """Producers and cones of one jaxpr's equations."""

  def __init__(self, eqns: Sequence[Any]):
    self.eqns = list(eqns)
    self.producer = {v: i for i, e in enumerate(self.eqns)
                     for v in e.outvars if not compat.is_dropvar(v)}

  def cone(self, outs: Sequence[Any], within: set[int] | None = None
           ) -> set[int]:
    """Equations (indices) computing ``outs`` (only those in ``within``)."""
    found: set[int] = set()
    todo = [v for v in outs if not compat.is_literal(v)]
    while todo:
      i = self.producer.get(todo.pop())
      if i is None or i in found or (within is not None and i not in within):
        continue
      found.add(i)
      todo.extend(v for v in self.eqns[i].invars if not compat.is_literal(v))
    return found

  def reads(self, run: set[int], outs: Sequence[Any], free: set[Any]
            ) -> list[Any]:
    """Variables the equations ``run`` and the outputs ``outs`` read that
    ``run`` does not make and ``free`` does not hold (first-read order)."""
    made = {v for i in run for v in self.eqns[i].outvars}
    seen: dict[Any, None] = {}
    for i in sorted(run):
      for v in self.eqns[i].invars:
        if not compat.is_literal(v) and v not in made and v not in free:
          seen.setdefault(v)
    for v in outs:
      if not compat.is_literal(v) and v not in made and v not in free:
        seen.setdefault(v)
    return list(seen)


def find(closed: Any, num_params: int, num_res: int, num_acts: int
         ) -> Split:
  """Splits a traced backward (see the module docstring for the rule).

  Args:
    closed: ``ClosedJaxpr`` with invars ``params + residuals + bars`` and
      outvars ``acts + grads``.
    num_params: Parameter invars.
    num_res: Stashed residual invars after them.
    num_acts: Input cotangent outvars (the rest are gradients).
  """
  jaxpr = closed.jaxpr
  g = _Graph(jaxpr.eqns)
  invars = list(jaxpr.invars)
  params = invars[:num_params]
  residuals = invars[num_params:num_params + num_res]
  bars = invars[num_params + num_res:]
  acts, grads = list(jaxpr.outvars[:num_acts]), list(jaxpr.outvars[num_acts:])
  free = set(params) | set(jaxpr.constvars)
  b_set = g.cone(acts)
  w_full = g.cone(grads)
  shared = b_set & w_full
  w_only = w_full - b_set
  forced = {i for i in shared if compat.sub_jaxprs(g.eqns[i])}

  def cost(recompute: set[int]) -> int:
    return sum(_nbytes(v) for v in g.reads(w_only | recompute, grads, free))

  cheap = {i for i in shared if compat.primitive_name(g.eqns[i]) in
           residual_trim.CHEAP and not compat.sub_jaxprs(g.eqns[i])}
  recompute = _greedy(g, cheap, w_only, forced, grads, free, cost)
  old_bytes = cost(shared)
  if old_bytes < cost(recompute):
    recompute = set(shared)
  w_run = w_only | recompute
  w_reads = g.reads(w_run, grads, free)
  res_pos = {v: k for k, v in enumerate(residuals)}
  w_res = tuple(sorted(res_pos[v] for v in w_reads if v in res_pos))
  handoff = tuple(v for v in w_reads if v not in res_pos)
  return Split(
      params=tuple(params),
      consts=tuple(zip(jaxpr.constvars, closed.consts)),
      residuals=tuple(residuals), bars=tuple(bars),
      b_eqns=tuple(g.eqns[i] for i in sorted(b_set)),
      w_eqns=tuple(g.eqns[i] for i in sorted(w_run)),
      acts=tuple(acts), grads=tuple(grads), handoff=handoff, w_res=w_res,
      w_bytes=cost(recompute), old_bytes=old_bytes)


def _greedy(g: _Graph, shared: set[int], w_only: set[int], forced: set[int],
            grads: Sequence[Any], free: set[Any], cost: Any) -> set[int]:
  """The shared equations ``W`` recomputes: ``forced`` plus the moves
  within ``shared`` that strictly lower ``cost`` (one equation, or it with
  its cone in ``shared``)."""
  recompute = set(forced)
  best = cost(recompute)
  improved = True
  while improved:
    improved = False
    frontier = [g.producer[v] for v in g.reads(w_only | recompute, grads, free)
                if g.producer.get(v) in shared]
    for i in sorted(set(frontier), reverse=True):
      for move in ({i}, g.cone(g.eqns[i].outvars, shared)):
        trial = recompute | move
        c = cost(trial)
        if c < best:
          recompute, best, improved = trial, c, True
          break
      if improved:
        break
  return recompute
