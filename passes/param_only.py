"""A kernel's parameter-only operations: found in its jaxpr, split off.

A kernel runs once per micro-batch, but some of its equations read only
its parameters: the transpose rule of a convolution reverses the weight's
spatial axes (``rev``) for every input-gradient convolution, a tied head
transposes its embedding. Inside the tick loop XLA cannot move them out
(they sit in a switch branch or a 0/1-trip loop), so they are redone at
every tick. :func:`find` names the values worth computing once per step
(``passes.hoist`` computes them before the tick loop); :func:`prelude`
evaluates them from the parameters, :func:`rest` runs the kernel's
equations with them given.

The rule (in the style of equinox's ``internal/_finalise_jaxpr.py``: one
pass over the top-level equations): an equation is *parameter-only* when
every input is a parameter, a literal or the output of a parameter-only
equation, and it has no effects. It does *work* unless it is a view or an
expansion (reshape, broadcast, convert, iota: XLA fuses those into their
reader for free, and a hoisted broadcast would hold a buffer as large as
an activation) or its output is larger than its largest input. A value is
hoisted when work went into it (it or an equation it depends on does
work, through views only) and something outside that set reads it: an
equation that is not parameter-only, an expansion, or the kernel's
outputs.

With ``constants=True`` (the profile only, ``cost.tick_kernel``) the
kernel's captured constants count as parameters, an equation of literals
alone (a broadcast scalar, an ``iota``) as a free constant, and a random
draw (``random_bits``) as work although its output outgrows its key: XLA
moves such work out of the tick loop itself (loop-invariant code motion).
nnx_transformer's dropout draws its masks from the module's constant key:
the lowered program computes them once per step, before the tick loop, but
the forward kernels timed alone drew them at every call, 4 masks in ~56
equations and 4 threefry loops, and were priced 0.22-0.25 ms against
0.15-0.18 without them (helper zoo12, session 36). ``passes.hoist``
(the lowering) does not hoist them (the default ``constants=False``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
from jax import lax

from tessel_jax import compat

# Views and expansions: free inside their reader's fusion; never hoisted on
# their own (an expansion's output is not hoisted at all).
_VIEWS = frozenset({"reshape", "squeeze", "expand_dims", "convert_element_type",
                    "copy", "copy_p", "sharding_constraint"})
_EXPANSIONS = frozenset({"broadcast_in_dim", "iota", "pad", "tile",
                         "concatenate"})
# Random draws: work although their output outgrows their key.
_DRAWS = frozenset({"random_bits", "threefry2x32", "rng_bit_generator"})


def nbytes(v: Any) -> int:
  """Bytes of a jaxpr variable."""
  aval = v.aval
  try:
    size = np.dtype(aval.dtype).itemsize
  except TypeError:  # an extended dtype (a PRNG key): its own itemsize
    size = int(getattr(aval.dtype, "itemsize", 8))
  return int(np.prod(aval.shape, dtype=np.int64)) * size


@dataclasses.dataclass(frozen=True, eq=False)
class Found:
  """The parameter-only part of one kernel jaxpr.

  Attributes:
    closed: The kernel's closed jaxpr.
    params: Its parameter input variables, in kernel order.
    hoisted: Variables computed once per step (parameter-only, work went
      into them, read outside the parameter-only part).
    prelude: The parameter-only equations the hoisted values need, in
      program order.
    stored: Per hoisted value, how it is stored: None (as computed);
      ``("perm", p)``: a convolution kernel read only by convolutions,
      transposed to the layout XLA's CPU convolution wants (spatial, input
      features, output features), so no transpose is left in the loop;
      ``("rev", dims)``: a parameter (or a view of one) that is the kernel
      of a convolution XLA swaps, stored reversed (:func:`_flip_dims`).
    rewrites: ``id(eqn)`` -> how a convolution reads a stored value:
      ``{"params": updates}`` (new dimension numbers for a permuted
      kernel) or ``{"rhs": index, "rev": dims}`` (its kernel is ``rev`` of
      hoisted value ``index``).
    signature: ``(primitive, shape, dtype, stored)`` of each hoisted
      value's producer: two traces of one kernel hoist the same values
      iff equal.
    const_params: Values of the trailing ``params`` that are the
      kernel's captured constants (``find(constants=True)``; else none).
  """

  closed: Any
  params: tuple[Any, ...]
  hoisted: tuple[Any, ...]
  prelude: tuple[Any, ...]
  stored: tuple[tuple[str, tuple[int, ...]] | None, ...]
  rewrites: Mapping[int, Mapping[str, Any]]
  signature: tuple[tuple[Any, ...], ...]
  const_params: tuple[Any, ...] = ()

  @property
  def nbytes(self) -> int:
    """Bytes of the hoisted values (held for the whole step)."""
    return sum(nbytes(v) for v in self.hoisted)


def _scan(eqns: Sequence[Any], params: Sequence[Any],
          constants: bool = False
          ) -> tuple[dict[Any, Any], set[Any], set[Any], set[Any]]:
  """``(producer of each parameter-only var, worked vars, expansion
  outputs, parameter-only vars)`` of the top-level equations
  (``constants``: see the module doc)."""
  producer: dict[Any, Any] = {}
  known, worked, expanded = set(params), set(), set()
  for eqn in eqns:
    ins = [v for v in eqn.invars if not compat.is_literal(v)]
    if eqn.effects or (not ins and not constants) or not all(
        v in known for v in ins):
      continue
    outs = [v for v in eqn.outvars if not compat.is_dropvar(v)]
    known.update(outs)
    for v in outs:
      producer[v] = eqn
    if not ins:  # literals alone: a free constant, folded by XLA
      continue
    name = compat.primitive_name(eqn)
    if name in _EXPANSIONS or any(v in expanded for v in ins):
      expanded.update(outs)
      continue
    grows = max((nbytes(v) for v in outs), default=0) > max(
        nbytes(v) for v in ins)
    if grows and not (constants and _draws(eqn)):
      expanded.update(outs)
    elif name not in _VIEWS or any(v in worked for v in ins):
      worked.update(outs)
  return producer, worked, expanded, known


def _draws(eqn: Any) -> bool:
  """Whether ``eqn`` is a random draw or a call holding one
  (``jax.random.bernoulli`` is a jitted call)."""
  if compat.primitive_name(eqn) in _DRAWS:
    return True
  return any(compat.primitive_name(e) in _DRAWS
             for sub in compat.sub_jaxprs(eqn)
             for e, _ in compat.iter_eqns_deep(sub))


def draws(found: Found) -> bool:
  """Whether ``found``'s prelude holds a random draw (work XLA cannot fold
  away as it folds other work on constants, ``find(constants=True)``)."""
  return any(_draws(e) for e in found.prelude)


def find(closed: Any, params: Sequence[Any],
         constants: bool = False) -> Found:
  """The values of ``closed`` worth computing once from ``params`` (its
  parameter input variables), and the equations that compute them; with
  ``constants``, also from its captured constants (see the module doc:
  for the profile, not the lowering)."""
  eqns = compat.jaxpr_eqns(closed)
  _, outvars = compat.jaxpr_io(closed)
  const_params: tuple[Any, ...] = ()
  if constants:
    constvars, consts = compat.jaxpr_consts(closed)
    params, const_params = list(params) + constvars, tuple(consts)
  producer, worked, expanded, known = _scan(eqns, params, constants)
  inside = {id(e) for e in producer.values()}
  readers: dict[Any, list[Any]] = {}
  for eqn in eqns:
    if id(eqn) not in inside:
      for v in eqn.invars:
        if not compat.is_literal(v) and v in known:
          readers.setdefault(v, []).append(eqn)
  out_read = {v for v in outvars if not compat.is_literal(v) and v in worked}
  order = [o for e in eqns for o in e.outvars if o in worked]  # program order
  hoisted = [v for v in order if v in readers or v in out_read]
  # XLA swaps a convolution whose kernel is larger than its input (and
  # reverses the kernel itself): hoisting that kernel's rev saves nothing.
  bad = {id(producer[v]) for v in hoisted
         if any(_swapped(e, v) for e in readers.get(v, []))}
  hoisted = [v for v in hoisted if id(producer[v]) not in bad]
  # A producer is dropped whole: all its outputs are hoisted.
  hoisted = list(dict.fromkeys(
      o for v in hoisted for o in producer[v].outvars
      if not compat.is_dropvar(o)))
  stored: list[Any] = []
  rewrites: dict[int, dict[str, Any]] = {}
  for v in hoisted:
    perm, updates = _conv_layout(v, readers.get(v, []))
    stored.append(None if perm is None else ("perm", perm))
    rewrites.update({k: {"params": u} for k, u in updates.items()})
  views = [v for v in list(params) + order
           if v in known and v not in worked and v not in expanded]
  for v in dict.fromkeys(views):
    dims = _flip_dims(v, readers.get(v, []))
    if dims is not None:
      rewrites.update({id(e): {"rhs": len(hoisted), "rev": dims}
                       for e in readers[v]
                       if compat.primitive_name(e) == "conv_general_dilated"})
      hoisted.append(v)
      stored.append(("rev", dims))
  need = _closure(producer, hoisted)
  prelude = tuple(e for e in eqns if id(e) in need)
  sig = tuple((compat.primitive_name(producer[v]) if v in producer else
               "param", tuple(v.aval.shape), str(v.aval.dtype), st)
              for v, st in zip(hoisted, stored))
  return Found(closed=closed, params=tuple(params), hoisted=tuple(hoisted),
               prelude=prelude, stored=tuple(stored), rewrites=rewrites,
               signature=sig, const_params=const_params)


def _flip_dims(v: Any, readers: Sequence[Any]) -> tuple[int, ...] | None:
  """The kernel's spatial axes where ``v`` (a parameter or a view of one)
  is the kernel of convolutions that XLA swaps (:func:`_swapped`), which
  would reverse it at every call: stored reversed, such a convolution
  reads ``rev`` of it, which XLA folds into the swap. Else None."""
  convs = [e for e in readers if _swapped(e, v)]
  if not convs:
    return None
  dims = {tuple(sorted(e.params["dimension_numbers"][1][2:])) for e in convs}
  return next(iter(dims)) if len(dims) == 1 else None


def _closure(producer: Mapping[Any, Any], roots: Sequence[Any]) -> set[int]:
  """Ids of the equations ``roots`` are computed from."""
  need: set[int] = set()
  stack = [producer[v] for v in roots if v in producer]
  while stack:
    eqn = stack.pop()
    if id(eqn) in need:
      continue
    need.add(id(eqn))
    stack.extend(producer[u] for u in eqn.invars
                 if not compat.is_literal(u) and u in producer)
  return need


def _swapped(eqn: Any, v: Any) -> bool:
  """``eqn`` is a convolution with kernel ``v`` larger than its input in
  every spatial dimension (XLA's algebraic simplifier swaps its operands
  and reverses the kernel at every call)."""
  if compat.primitive_name(eqn) != "conv_general_dilated" or \
      eqn.invars[1] is not v:
    return False
  lhs_spec, rhs_spec, _ = eqn.params["dimension_numbers"]
  lhs, rhs = eqn.invars[0].aval.shape, v.aval.shape
  ld = eqn.params.get("lhs_dilation") or (1,) * (len(rhs) - 2)
  rd = eqn.params.get("rhs_dilation") or (1,) * (len(rhs) - 2)
  return all(
      1 + (rhs[k] - 1) * r > 1 + (lhs[i] - 1) * l
      for i, k, l, r in zip(lhs_spec[2:], rhs_spec[2:], ld, rd))


def _conv_layout(v: Any, readers: Sequence[Any]
                 ) -> tuple[tuple[int, ...] | None, dict[int, Any]]:
  """``(perm, rewrites)``: where every reader of ``v`` is a convolution
  taking it as its kernel in one dimension order that is not XLA CPU's
  (spatial..., in, out; e.g. the input-gradient convolution's, which XLA
  would transpose at every call), the permutation storing ``v`` in that
  order and the readers' new dimension numbers; else ``(None, {})``."""
  if not readers or any(
      compat.primitive_name(e) != "conv_general_dilated" or
      e.invars[1] is not v or e.invars[0] is v for e in readers):
    return None, {}
  dns = {tuple(e.params["dimension_numbers"]) for e in readers}
  if len(dns) != 1:
    return None, {}
  lhs, rhs, out = next(iter(dns))
  perm = tuple(rhs[2:]) + (rhs[1], rhs[0])
  if perm == tuple(range(len(rhs))):
    return None, {}
  r = len(rhs)
  dn = lax.ConvDimensionNumbers(lhs_spec=lhs, rhs_spec=(r - 1, r - 2) +
                                tuple(range(r - 2)), out_spec=out)
  return perm, {id(e): {"dimension_numbers": dn} for e in readers}


def prelude(found: Found, pvals: Sequence[Any]) -> list[Any]:
  """The hoisted values computed from the parameter values (each in its
  ``perm``; the captured constants among ``found.params`` added)."""
  vals = compat.eval_eqns(found.prelude, found.params, found.hoisted,
                          list(pvals) + list(found.const_params))
  return [store(x, st) for x, st in zip(vals, found.stored)]


def store(x: Any, stored: tuple[str, tuple[int, ...]] | None) -> Any:
  """A hoisted value as it is stored (``Found.stored``)."""
  if stored is None:
    return x
  kind, axes = stored
  return lax.transpose(x, axes) if kind == "perm" else lax.rev(x, axes)


def rest(found: Found, args: Sequence[Any], hvals: Sequence[Any]
         ) -> list[Any]:
  """The kernel's outputs from its arguments (``closed``'s invars, in
  order) with the hoisted values given: their producers are not run."""
  given = {v for v, st in zip(found.hoisted, found.stored)
           if st is None or st[0] != "rev"}
  invars, outvars = compat.jaxpr_io(found.closed)
  eqns = _live([e for e in compat.jaxpr_eqns(found.closed)
                if not any(v in given for v in e.outvars)], outvars)
  constvars, consts = compat.jaxpr_consts(found.closed)
  env = dict(zip(constvars + invars, consts + list(args)))
  env.update((v, x) for v, x in zip(found.hoisted, hvals) if v in given)
  read = lambda v: compat.literal_value(v) if compat.is_literal(v) else env[v]
  for eqn in compat.retarget_constraints(eqns):
    how = found.rewrites.get(id(eqn), {})
    ins = [read(v) for v in eqn.invars]
    if "rhs" in how:
      ins[1] = lax.rev(hvals[how["rhs"]], how["rev"])
    outs = compat.bind_eqn(eqn, ins, **how.get("params", {}))
    env.update(zip(eqn.outvars, outs))
  return [read(v) for v in outvars]


def _live(eqns: Sequence[Any], outvars: Sequence[Any]) -> list[Any]:
  """``eqns`` less those whose outputs nothing reads (a hoisted value's
  producers left behind: ``rev`` before a hoisted transpose)."""
  need = {v for v in outvars if not compat.is_literal(v)}
  keep = []
  for eqn in reversed(eqns):
    if eqn.effects or any(v in need for v in eqn.outvars):
      keep.append(eqn)
      need.update(v for v in eqn.invars if not compat.is_literal(v))
  return keep[::-1]


def value_prelude(found: Found, v: Any) -> tuple[list[Any], list[Any]]:
  """``(equations, parameter variables read)`` that compute the hoisted
  value ``v`` alone (a slice of ``found.prelude``)."""
  producer = {o: e for e in found.prelude for o in e.outvars}
  need = _closure(producer, [v])
  eqns = [e for e in found.prelude if id(e) in need]
  read = {u for e in eqns for u in e.invars if not compat.is_literal(u)}
  read.add(v)  # a parameter stored as it is (reversed)
  return eqns, [p for p in found.params if p in read]
