"""Vjp residuals that ``B`` can rebuild cheaply, left out of the stash.

``jax.vjp`` keeps every value its linearised backward reads. Some of them
are cheap functions of others it keeps: ``tanh``'s rule keeps both
``t = tanh(z)`` and ``1 - t`` (``1 - t`` is elementwise in ``t``), a
residual may be a reshape, broadcast or slice of another or of a parameter,
or the very same value twice. Stashing those costs a write in ``F``, stash bytes
per micro-batch in flight (zero-filled and page-faulted at every step) and a
read in ``B``; recomputing them costs one fused elementwise pass in ``B``.

:func:`find` reads the abstract probe's jaxpr (parameters and block inputs
in, residuals out) and names the residuals that equations of
:data:`CHEAP` kinds (at most :data:`MAX_EQNS` of them) compute from
literals, parameters and *kept* residuals; :class:`Recipe` keeps the rest
for the stash and rebuilds the full list in ``B`` (its equations run at the
top level of the kernel, so ``passes.hoist`` and XLA see them as any other).
Unlike ``jax.checkpoint`` with a policy, nothing here depends on the trace
context: inside the lowering's ``shard_map`` a literal may reach the
linearisation as a traced scalar (``reshard 1.0``), which a policy would
stash and the abstract probe would not.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

from tessel_jax import compat

#: Primitives recomputed in ``B`` rather than stashed: memory-bound
#: elementwise arithmetic, comparisons, views and static slices (XLA fuses
#: them into their reader; a slice of a parameter -- a dead-tap conv
#: kernel, ``passes.dead_taps`` -- is parameter-only work ``passes.hoist``
#: runs once per step: ResNet18's stage 3/4 forwards stashed 5 MB of such
#: kernels per micro-batch for their backward to read and transpose).
#: Transcendentals, reductions, dots and anything with a sub-jaxpr or an
#: effect stay stashed.
CHEAP = frozenset({
    "add", "add_any", "sub", "mul", "neg", "integer_pow", "square", "abs",
    "sign", "max", "min", "select_n", "convert_element_type",
    "reduce_precision", "broadcast_in_dim", "reshape", "squeeze",
    "expand_dims", "copy", "copy_p", "eq", "ne", "lt", "le", "gt", "ge",
    "and", "or", "not", "slice"})

MAX_EQNS = 16
"""Longest recomputation per residual (equations)."""

@dataclasses.dataclass(frozen=True, eq=False)
class Recipe:
  """Which residuals are stashed and how ``B`` rebuilds the others.

  Attributes:
    count: Residuals of the vjp closure (not its parameter leaves).
    kept: Positions stashed, in order.
    eqns: Equations computing the rebuilt ones (program order).
    params: Parameter variables the equations read, by parameter position.
    sources: Kept residual variables they read, by residual position.
    derived: ``(position, variable or literal)`` of each rebuilt residual.
  """

  count: int
  kept: tuple[int, ...]
  eqns: tuple[Any, ...] = ()
  params: tuple[tuple[int, Any], ...] = ()
  sources: tuple[tuple[int, Any], ...] = ()
  derived: tuple[tuple[int, Any], ...] = ()

  def keep(self, residuals: Sequence[Any]) -> list[Any]:
    """The stashed subset of the full residual list."""
    return [residuals[k] for k in self.kept]

  def rebuild(self, stashed: Sequence[Any], pvals: Sequence[Any]
              ) -> list[Any]:
    """The full residual list from the stashed ones and the parameters."""
    full: list[Any] = [None] * self.count
    for k, v in zip(self.kept, stashed):
      full[k] = v
    if not self.derived:
      return full
    invars = [v for _, v in self.params] + [v for _, v in self.sources]
    args = [pvals[q] for q, _ in self.params] + [full[k] for k, _ in
                                                 self.sources]
    outs = compat.eval_eqns(list(self.eqns), invars,
                            [v for _, v in self.derived], args)
    for (k, _), v in zip(self.derived, outs):
      full[k] = v
    return full


def keep_all(count: int) -> Recipe:
  """Every residual stashed."""
  return Recipe(count, tuple(range(count)))


def find(closed: Any, num_params: int, enabled: bool = True) -> Recipe:
  """The recipe of a probe jaxpr.

  Args:
    closed: ``ClosedJaxpr`` with the block's parameters (first
      ``num_params`` invars) and data inputs in, residuals out.
    num_params: Parameter invars.
    enabled: False: every residual kept (``Switches.residual_trim``).

  Returns:
    The :class:`Recipe`; every residual kept when not ``enabled`` or
    nothing is cheap to rebuild.
  """
  jaxpr = closed.jaxpr
  outs = list(jaxpr.outvars)
  if not enabled or jaxpr.constvars:
    return keep_all(len(outs))
  producer = {v: e for e in jaxpr.eqns for v in e.outvars}
  params = {v: q for q, v in enumerate(jaxpr.invars[:num_params])}
  first = {}
  for k, v in enumerate(outs):
    if not compat.is_literal(v):
      first.setdefault(v, k)
  derived: dict[int, list[Any]] = {}
  used: set[int] = set()
  for k, v in enumerate(outs):
    if k in used or compat.is_literal(v):
      continue
    walk = _walk(v, k, first, derived, params, producer)
    if walk is not None:
      derived[k] = walk[0]
      used |= walk[1]
  if not derived:
    return keep_all(len(outs))
  position = {id(e): i for i, e in enumerate(jaxpr.eqns)}
  return _recipe(outs, derived, params, first, position)


def _walk(v: Any, k: int, first: dict, derived: dict, params: dict,
          producer: dict) -> tuple[list[Any], set[int]] | None:
  """``(equations, kept residual positions read)`` computing residual
  ``k`` (variable ``v``) from parameters, literals and kept residuals;
  None if it needs anything else."""
  if first.get(v, k) != k and first[v] not in derived:
    return [], {first[v]}  # the same value stashed twice
  eqns: list[Any] = []
  reads: set[int] = set()
  todo, seen = [v], set()
  while todo:
    x = todo.pop()
    if compat.is_literal(x) or x in seen or x in params:
      continue
    seen.add(x)
    j = first.get(x)
    if x is not v and j is not None and j not in derived:
      reads.add(j)
      continue
    e = producer.get(x)
    if (e is None or compat.primitive_name(e) not in CHEAP or e.effects
        or compat.sub_jaxprs(e) or len(eqns) >= MAX_EQNS):
      return None
    eqns.append(e)
    todo.extend(e.invars)
  return eqns, reads


def _recipe(outs: Sequence[Any], derived: dict[int, list[Any]],
            params: dict, first: dict, position: dict[int, int]) -> Recipe:
  """Assembles the :class:`Recipe` of the residuals in ``derived``
  (``position``: each equation's index in the probe, by ``id``)."""
  unique = {id(e): e for es in derived.values() for e in es}
  eqns = sorted(unique.values(), key=lambda e: position[id(e)])
  made = {v for e in eqns for v in e.outvars}
  read = [x for e in eqns for x in e.invars if not compat.is_literal(x)]
  read += [outs[k] for k in derived]
  pvars = {x for x in read if x in params}
  svars = {x for x in read if x not in made and x not in params}
  return Recipe(
      count=len(outs),
      kept=tuple(k for k in range(len(outs)) if k not in derived),
      eqns=tuple(eqns),
      params=tuple(sorted(((params[x], x) for x in pvars),
                          key=lambda t: t[0])),
      sources=tuple(sorted(((first[x], x) for x in svars),
                           key=lambda t: t[0])),
      derived=tuple((k, outs[k]) for k in sorted(derived)))
