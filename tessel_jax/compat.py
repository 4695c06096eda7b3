"""The one module that touches JAX internals (jax.extend, jaxpr objects).

Everything version-sensitive lives here so that a JAX upgrade is one file's
work: the ``tessel_boundary`` primitive and its rules, jaxpr inspection and
re-evaluation of jaxpr slices, the Auto-typed copy of a mesh, and the
device memory query. Measured on JAX 0.10.2
(DESIGN.md §5).
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import jax
from jax.extend import core as jex_core
from jax.interpreters import ad, batching, mlir
from jax.sharding import AxisType, Mesh
from jax.sharding import PartitionSpec as P

# --- the boundary primitive ---------------------------------------------------

BOUNDARY_NAME = "tessel_boundary"

boundary_p = jex_core.Primitive(BOUNDARY_NAME)
boundary_p.multiple_results = True


def _boundary_impl(*xs: Any) -> tuple[Any, ...]:
  return tuple(xs)


def _boundary_abstract_eval(*avals: Any) -> tuple[Any, ...]:
  return tuple(avals)


def _boundary_lowering(ctx: Any, *xs: Any) -> Sequence[Any]:
  del ctx
  return list(xs)


def _boundary_jvp(primals: Sequence[Any],
                  tangents: Sequence[Any]) -> tuple[Any, Any]:
  # Tangents pass straight through: the linear part has no boundary, so no
  # transpose rule is needed and grad/vjp work on the unpartitioned function.
  return boundary_p.bind(*primals), list(tangents)


def _boundary_batch(args: Sequence[Any], dims: Sequence[Any]) -> tuple[Any, Any]:
  return boundary_p.bind(*args), list(dims)


boundary_p.def_impl(_boundary_impl)
boundary_p.def_abstract_eval(_boundary_abstract_eval)
mlir.register_lowering(boundary_p, _boundary_lowering)
ad.primitive_jvps[boundary_p] = _boundary_jvp
batching.primitive_batchers[boundary_p] = _boundary_batch


def bind_boundary(*xs: Any) -> tuple[Any, ...]:
  """Binds the identity ``tessel_boundary`` primitive on ``xs``."""
  return tuple(boundary_p.bind(*xs))


# --- jaxpr inspection ---------------------------------------------------------

ClosedJaxpr = jex_core.ClosedJaxpr
Jaxpr = jex_core.Jaxpr
Literal = jex_core.Literal
Var = jex_core.Var
DropVar = jex_core.DropVar


def is_boundary(eqn: Any) -> bool:
  """True when ``eqn`` is a ``tessel_boundary`` equation."""
  return eqn.primitive is boundary_p


def primitive_name(eqn: Any) -> str:
  return str(eqn.primitive.name)


def sub_jaxprs(eqn: Any) -> list[Any]:
  """Jaxprs nested in an equation's parameters (cond branches, scan bodies)."""
  return list(jex_core.jaxprs_in_params(eqn.params))


def iter_eqns_deep(jaxpr: Any) -> Iterator[tuple[Any, tuple[str, ...]]]:
  """Yields ``(eqn, enclosing primitive names)`` for every nested equation."""
  stack = [(jaxpr, ())]
  while stack:
    current, path = stack.pop()
    for eqn in current.eqns:
      yield eqn, path
      for sub in sub_jaxprs(eqn):
        stack.append((sub, path + (primitive_name(eqn),)))


def is_literal(atom: Any) -> bool:
  return isinstance(atom, Literal)


def is_dropvar(atom: Any) -> bool:
  return isinstance(atom, DropVar)


def literal_value(atom: Any) -> Any:
  return atom.val


def new_var(aval: Any) -> Any:
  """A fresh jaxpr variable of abstract value ``aval``."""
  return Var(aval)


def make_jaxpr(fn: Callable[..., Any], *args: Any,
               inline_jit: bool = False) -> tuple[Any, Any]:
  """Traces ``fn(*args)`` (args may be ShapeDtypeStructs).

  Args:
    fn: The function.
    *args: Abstract or concrete arguments.
    inline_jit: Trace under ``jax.disable_jit`` so nested ``jax.jit`` calls
      are inlined into the top-level jaxpr.

  Returns:
    ``(closed_jaxpr, out_tree)``.
  """
  if inline_jit:
    with jax.disable_jit():
      closed, shape = jax.make_jaxpr(fn, return_shape=True)(*args)
  else:
    closed, shape = jax.make_jaxpr(fn, return_shape=True)(*args)
  return closed, jax.tree_util.tree_structure(shape)


def _strip_axes(entry: Any, drop: frozenset) -> Any:
  """A ``PartitionSpec`` entry without the axes in ``drop``."""
  if entry is None or entry is P.UNCONSTRAINED:
    return entry
  axes = tuple(a for a in (entry if isinstance(entry, tuple) else (entry,))
               if a not in drop)
  return None if not axes else axes[0] if len(axes) == 1 else axes


def context_mesh() -> Any:
  """The abstract mesh of the current trace context (hashable; empty outside
  any mesh or ``shard_map``)."""
  return jax.sharding.get_abstract_mesh()


def plain_aval(x: Any) -> jax.ShapeDtypeStruct | None:
  """``x``'s abstract value as a ``ShapeDtypeStruct`` (weak type kept): a
  function traced on it binds what it binds traced on ``x``. None when
  ``x``'s type says more than shape, dtype and weak type (a sharding naming
  mesh axes, varying over manual axes inside ``shard_map``: its printed
  type differs from the plain one's), which a ``ShapeDtypeStruct`` does
  not carry."""
  try:
    a = jax.typeof(x)
    sds = jax.ShapeDtypeStruct(tuple(a.shape), a.dtype,
                               weak_type=bool(getattr(a, "weak_type", False)))
    plain = jax.typeof(sds)
  except (TypeError, AttributeError):
    return None
  if str(a) != str(plain):
    return None
  spec = getattr(getattr(a, "sharding", None), "spec", None)
  if spec is not None and any(e is not None for e in spec):
    return None
  return sds


def retarget_constraints(eqns: Sequence[Any]) -> list[Any]:
  """``eqns`` with their sharding constraints moved to the current mesh.

  A ``with_sharding_constraint`` traced in the user's function names the
  user's mesh (all axes Auto); replayed inside the lowering's ``shard_map``
  (manual over the pipe and data axes) it must name the context mesh and
  only its GSPMD axes. Entries naming manual axes are dropped (the manual
  split already places those dimensions). Outside any mesh context (a
  kernel profiled alone on one device) see ``drop_constraints``.
  """
  ctx = context_mesh()
  manual = frozenset(getattr(ctx, "manual_axes", ()) or ())
  if ctx.empty or not manual:
    return list(eqns)
  out = []
  for eqn in eqns:
    sharding = eqn.params.get("sharding") if eqn.primitive.name == \
        "sharding_constraint" else None
    if isinstance(sharding, jax.sharding.NamedSharding):
      spec = P(*(_strip_axes(e, manual) for e in sharding.spec))
      params = dict(eqn.params, sharding=jax.sharding.NamedSharding(ctx, spec))
      if "context_mesh" in params:
        params["context_mesh"] = ctx
      eqn = eqn.replace(params=params)
    out.append(eqn)
  return out


def _is_named_constraint(eqn: Any) -> bool:
  return (eqn.primitive.name == "sharding_constraint" and isinstance(
      eqn.params.get("sharding"), jax.sharding.NamedSharding))


def drop_constraints(eqns: Sequence[Any], outvars: Sequence[Any]
                     ) -> tuple[list[Any], list[Any]]:
  """``(eqns, outvars)`` without mesh sharding constraints, when traced
  outside any mesh context (a kernel compiled alone for one device, which a
  constraint naming the user's whole mesh would refuse); a constraint never
  changes values. Inside a mesh context both are returned unchanged."""
  if not context_mesh().empty or not any(_is_named_constraint(e)
                                         for e in eqns):
    return list(eqns), list(outvars)
  alias: dict[Any, Any] = {}
  sub = lambda v: alias.get(v, v) if isinstance(v, Var) else v
  out = []
  for eqn in eqns:
    if _is_named_constraint(eqn) and len(eqn.invars) == 1:
      alias[eqn.outvars[0]] = sub(eqn.invars[0])
      continue
    out.append(eqn.replace(invars=[sub(v) for v in eqn.invars]))
  return out, [sub(v) for v in outvars]


def eval_eqns(eqns: Sequence[Any], invars: Sequence[Any],
              outvars: Sequence[Any], args: Sequence[Any]) -> list[Any]:
  """Evaluates a slice of a jaxpr.

  Args:
    eqns: Equations in program order.
    invars: Variables the equations read that they do not define.
    outvars: Variables (or literals) to return.
    args: Values for ``invars``.

  Returns:
    Values of ``outvars``.
  """
  return list(jex_core.jaxpr_as_fun(closed_from_eqns(eqns, invars, outvars))(
      *args))


def closed_from_eqns(eqns: Sequence[Any], invars: Sequence[Any],
                     outvars: Sequence[Any]) -> Any:
  """A slice of a jaxpr (see :func:`eval_eqns`) as a ClosedJaxpr with no
  constants."""
  eqns = retarget_constraints(eqns)
  eqns, outvars = drop_constraints(eqns, outvars)
  effects = frozenset().union(*(e.effects for e in eqns)) if eqns else frozenset()
  info = jex_core.DebugInfo("tessel_jax block", "tessel_jax",
                            tuple(f"in{i}" for i in range(len(invars))),
                            tuple(f"out{i}" for i in range(len(outvars))))
  jaxpr = Jaxpr(constvars=[], invars=list(invars), outvars=list(outvars),
                eqns=list(eqns), effects=effects, debug_info=info)
  return ClosedJaxpr(jaxpr, [])


def jaxpr_text(eqns: Sequence[Any], invars: Sequence[Any],
               outvars: Sequence[Any]) -> str:
  """Printed jaxpr of a slice of equations (names by position, so equal
  programs print equal text); the measurement cache keys kernels by it."""
  effects = frozenset().union(*(e.effects for e in eqns)) if eqns else frozenset()
  info = jex_core.DebugInfo("tessel_jax kernel key", "tessel_jax",
                            tuple(f"in{i}" for i in range(len(invars))),
                            tuple(f"out{i}" for i in range(len(outvars))))
  jaxpr = Jaxpr(constvars=[], invars=list(invars), outvars=list(outvars),
                eqns=list(eqns), effects=effects, debug_info=info)
  return plain_text(jaxpr)


_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")


def plain_text(jaxpr: Any) -> str:
  """Printed (closed) jaxpr without colour: the same text in a terminal, a
  pipe or CI (``str(jaxpr)`` adds ANSI colour codes when stdout is a
  terminal), so cache keys built from it are stable."""
  try:
    text = str(jaxpr.pretty_print(use_color=False))
  except TypeError:  # a JAX whose pretty_print has no use_color
    text = str(jaxpr)
  return _ANSI.sub("", text)


# --- shard_map helpers --------------------------------------------------------


def auto_mesh(mesh: Mesh) -> Mesh:
  """The same devices and axis names with every axis typed ``Auto``.

  ``jax.make_mesh`` gives Explicit axes on JAX 0.10; shard_map then insists
  that inputs already carry the in_specs sharding. An Auto copy lets the
  lowering reshard its inputs freely.
  """
  types = getattr(mesh, "axis_types", None)
  if types is not None and all(t == AxisType.Auto for t in types):
    return mesh
  return Mesh(mesh.devices, mesh.axis_names,
              axis_types=(AxisType.Auto,) * len(mesh.axis_names))


def has_explicit_axes(mesh: Mesh) -> bool:
  """True when some axis of ``mesh`` is typed ``Explicit``."""
  types = getattr(mesh, "axis_types", None) or ()
  return any(t == AxisType.Explicit for t in types)


def device_memory_limit(device: Any) -> int | None:
  """Bytes the device reports as its memory limit (None when unknown)."""
  try:
    stats = device.memory_stats()
  except Exception:  # pylint: disable=broad-except
    return None
  if not stats:
    return None
  limit = stats.get("bytes_limit") or stats.get("bytes_reservable_limit")
  return int(limit) if limit else None


def float0_zeros(shape: tuple[int, ...]) -> Any:
  """Zero cotangent for an integer value (dtype float0)."""
  import numpy as np  # pylint: disable=import-outside-toplevel
  return np.zeros(shape, dtype=jax.dtypes.float0)


# --- jaxpr rewriting for the automatic cut ------------------------------------

_CALL_BODIES = {"jit": "jaxpr", "pjit": "jaxpr", "closed_call": "call_jaxpr",
                "core_call": "call_jaxpr"}


def call_body(eqn: Any) -> tuple[Any, list[Any]] | None:
  """``(jaxpr, consts)`` of a plain call (``jax.jit``, closed_call), else None.

  Only calls whose semantics are "run this jaxpr" qualify; custom_jvp/vjp,
  remat, cond, scan and while keep their equation.
  """
  key = _CALL_BODIES.get(primitive_name(eqn))
  if key is None or key not in eqn.params:
    return None
  body = eqn.params[key]
  if isinstance(body, ClosedJaxpr):
    return body.jaxpr, list(body.consts)
  return body, []


def _inline_eval(jaxpr: Any, consts: Sequence[Any], args: Sequence[Any],
                 drop_boundaries: bool) -> list[Any]:
  env: dict[Any, Any] = {}

  def read(v: Any) -> Any:
    return v.val if isinstance(v, Literal) else env[v]

  env.update(zip(jaxpr.constvars, consts))
  env.update(zip(jaxpr.invars, args))
  for eqn in jaxpr.eqns:
    ins = [read(v) for v in eqn.invars]
    body = call_body(eqn)
    if body is not None:
      outs = _inline_eval(body[0], body[1], ins, drop_boundaries)
    elif drop_boundaries and is_boundary(eqn):
      outs = ins
    else:
      params = eqn.primitive.get_bind_params(eqn.params)
      outs = eqn.primitive.bind(*ins, **params)
      if not eqn.primitive.multiple_results:
        outs = [outs]
    for v, x in zip(eqn.outvars, outs):
      if not isinstance(v, DropVar):
        env[v] = x
  return [read(v) for v in jaxpr.outvars]


def flatten_jaxpr(closed: Any, *, drop_boundaries: bool = False) -> Any:
  """Inlines nested ``jax.jit`` / closed calls into the top level.

  Re-traces ``closed`` binding the same primitives, so the result computes
  the same values with the same invars (in order) and outputs; calls nested
  in calls are inlined too. Other higher-order equations (scan, cond, while,
  remat, custom_jvp/vjp) stay single equations.

  Args:
    closed: A ClosedJaxpr.
    drop_boundaries: Also remove ``tessel_boundary`` equations (their
      outputs become their inputs).

  Returns:
    A ClosedJaxpr (``closed`` itself when there is nothing to inline or drop).
  """
  if not any(call_body(e) is not None or (drop_boundaries and is_boundary(e))
             for e in closed.jaxpr.eqns):
    return closed
  avals = [jax.ShapeDtypeStruct(v.aval.shape, v.aval.dtype)
           for v in closed.jaxpr.invars]

  def run(*args: Any) -> list[Any]:
    return _inline_eval(closed.jaxpr, closed.consts, args, drop_boundaries)

  return jax.make_jaxpr(run)(*avals)


def eqn_params(eqn: Any) -> Any:
  """An equation's parameters (read-only mapping)."""
  return eqn.params


def eval_closed(closed: Any, args: Sequence[Any]) -> list[Any]:
  """Evaluates a ClosedJaxpr on ``args`` (binds its equations: traceable)."""
  eqns = retarget_constraints(closed.jaxpr.eqns)
  eqns, outvars = drop_constraints(eqns, closed.jaxpr.outvars)
  if len(eqns) != len(closed.jaxpr.eqns) or any(
      a is not b for a, b in zip(eqns, closed.jaxpr.eqns)):
    closed = ClosedJaxpr(closed.jaxpr.replace(eqns=eqns, outvars=outvars),
                         list(closed.consts))
  return list(jex_core.jaxpr_as_fun(closed)(*args))


# --- scans split at iteration boundaries (passes/scan_split) ------------------

_REMAT_NAMES = ("checkpoint", "remat", "remat2")


def is_scan(eqn: Any) -> bool:
  """True for a ``lax.scan`` equation (fori_loop with static bounds too)."""
  return primitive_name(eqn) == "scan"


def scan_layout(eqn: Any) -> tuple[int, int, int, bool]:
  """``(length, num_consts, num_carry, reverse)`` of a scan equation.

  jax <= 0.10 names the counts (``num_consts``, ``num_carry``); jax >= 0.11
  gives the inputs' groups instead (``ft_in``: consts, carry, xs; one
  entry per flat input).
  """
  p = eqn.params
  if "num_consts" in p:
    return (int(p["length"]), int(p["num_consts"]), int(p["num_carry"]),
            bool(p["reverse"]))
  sizes = _input_group_sizes(p["ft_in"])
  if len(sizes) != 3 or sum(sizes) != len(eqn.invars):
    raise NotImplementedError(
        f"tessel_jax cannot read this jax {jax.__version__} scan's inputs"
        f" (ft_in={p['ft_in']!r} for {len(eqn.invars)} inputs); pin jax to"
        f" a version the project tests (pyproject.toml)")
  return int(p["length"]), sizes[0], sizes[1], bool(p["reverse"])


def _input_group_sizes(groups: Any) -> list[int]:
  """Flat inputs per group of a jax >= 0.11 scan's ``ft_in`` (a
  ``jax._src.flattree.FlatTree`` of the groups consts, carry, xs: ``unpack``
  gives the groups, ``len`` a group's inputs)."""
  return [len(group) for group in groups.unpack()]


def scan_body(eqn: Any) -> Any:
  """The body (a ClosedJaxpr) of a scan equation (jax >= 0.11 keeps an
  open Jaxpr without constants there)."""
  body = eqn.params["jaxpr"]
  if isinstance(body, ClosedJaxpr):
    return body
  if body.constvars:
    raise NotImplementedError(
        f"tessel_jax cannot read this jax {jax.__version__} scan body"
        f" with {len(body.constvars)} constants; pin jax to a version the"
        f" project tests (pyproject.toml)")
  return ClosedJaxpr(body, ())


def bind_scan(eqn: Any, ins: Sequence[Any], length: int,
              body: Any = None) -> list[Any]:
  """``eqn``'s scan over ``length`` iterations of ``body`` (a ClosedJaxpr
  with the scan body's signature; default: its own) on ``ins`` (consts,
  carry, xs); returns the final carry then the ys.

  jax <= 0.10 rebinds the primitive with the new parameters; later
  versions hold the body in another form, so there the scan is built
  anew with ``lax.scan`` around the body.
  """
  if "num_consts" in eqn.params:
    updates: dict[str, Any] = {"length": length}
    if body is not None:
      updates["jaxpr"] = body
    return bind_eqn(eqn, ins, **updates)
  _, nc, ncar, reverse = scan_layout(eqn)
  run = jex_core.jaxpr_as_fun(scan_body(eqn) if body is None else body)
  consts = list(ins[:nc])

  def one(carry: list[Any], xs: list[Any]) -> tuple[list[Any], list[Any]]:
    outs = run(*consts, *carry, *xs)
    return list(outs[:ncar]), list(outs[ncar:])

  carry, ys = jax.lax.scan(one, list(ins[nc:nc + ncar]),
                           list(ins[nc + ncar:]), length=length,
                           reverse=reverse,
                           unroll=eqn.params.get("unroll", 1))
  return list(carry) + list(ys)


def remat_info(eqn: Any) -> tuple[Any, dict[str, Any]] | None:
  """``(body jaxpr, checkpoint kwargs)`` of a ``jax.checkpoint`` equation.

  The kwargs (``prevent_cse``, ``policy``) rebuild an equivalent
  ``jax.checkpoint`` around other code; None for any other equation.
  """
  if primitive_name(eqn) not in _REMAT_NAMES or "jaxpr" not in eqn.params:
    return None
  p = eqn.params
  return p["jaxpr"], {"prevent_cse": p.get("prevent_cse", True),
                      "policy": p.get("policy")}


def bind_eqn(eqn: Any, ins: Sequence[Any], **updates: Any) -> list[Any]:
  """Binds ``eqn``'s primitive on ``ins`` with its parameters (some updated,
  e.g. a scan's ``length`` or ``jaxpr``); returns the outputs as a list."""
  # A copy: some primitives' get_bind_params return the equation's own dict.
  params = dict(eqn.primitive.get_bind_params(eqn.params))
  params.update(updates)
  outs = eqn.primitive.bind(*ins, **params)
  return list(outs) if eqn.primitive.multiple_results else [outs]


def jaxpr_eqns(jaxpr: Any) -> list[Any]:
  """Equations of a Jaxpr or ClosedJaxpr."""
  return list(getattr(jaxpr, "jaxpr", jaxpr).eqns)


def jaxpr_io(jaxpr: Any) -> tuple[list[Any], list[Any]]:
  """``(invars, outvars)`` of a Jaxpr or ClosedJaxpr."""
  inner = getattr(jaxpr, "jaxpr", jaxpr)
  return list(inner.invars), list(inner.outvars)


def retrace(closed: Any, handler: Callable[[int, Any, list[Any]],
                                           list[Any] | None]) -> Any:
  """Re-traces ``closed``'s top-level equations through ``handler``.

  ``handler(index, eqn, inputs)`` returns the equation's outputs after
  binding whatever it likes (sub-scans, boundaries), or None to bind the
  equation unchanged. The result has the same invars (in order), constants
  and outputs as ``closed``.
  """
  jaxpr = closed.jaxpr
  avals = [jax.ShapeDtypeStruct(v.aval.shape, v.aval.dtype)
           for v in jaxpr.invars]

  def run(*args: Any) -> list[Any]:
    env: dict[Any, Any] = {}

    def read(v: Any) -> Any:
      return v.val if isinstance(v, Literal) else env[v]

    env.update(zip(jaxpr.constvars, closed.consts))
    env.update(zip(jaxpr.invars, args))
    for i, eqn in enumerate(jaxpr.eqns):
      ins = [read(v) for v in eqn.invars]
      outs = handler(i, eqn, ins)
      if outs is None:
        outs = bind_eqn(eqn, ins)
      for v, x in zip(eqn.outvars, outs):
        if not isinstance(v, DropVar):
          env[v] = x
    return [read(v) for v in jaxpr.outvars]

  return jax.make_jaxpr(run)(*avals)


def jaxpr_consts(closed: Any) -> tuple[list[Any], list[Any]]:
  """``(constvars, consts)`` of a ClosedJaxpr."""
  return list(closed.jaxpr.constvars), list(closed.consts)


def slice_rows(eqn: Any) -> tuple[int, int] | None:
  """``(lo, hi)`` when ``eqn`` is a ``slice`` of rows ``[lo, hi)`` of axis 0
  keeping every other axis whole (unit strides); else None."""
  if primitive_name(eqn) != "slice":
    return None
  p = eqn.params
  shape = eqn.invars[0].aval.shape
  start, limit = tuple(p["start_indices"]), tuple(p["limit_indices"])
  strides = p.get("strides")
  if not shape or (strides is not None and any(s != 1 for s in strides)):
    return None
  if any(a != 0 for a in start[1:]) or tuple(limit[1:]) != tuple(shape[1:]):
    return None
  return int(start[0]), int(limit[0])


def with_invars(closed: Any, invars: Sequence[Any],
                drop: Sequence[Any]) -> Any:
  """``closed`` with new top-level invars and the equations ``drop`` (by
  identity) removed; variables and outputs are otherwise unchanged."""
  dropped = {id(e) for e in drop}
  jaxpr = closed.jaxpr
  info = jex_core.DebugInfo("tessel_jax split leaves", "tessel_jax",
                            tuple(f"in{i}" for i in range(len(invars))),
                            tuple(f"out{i}" for i in range(len(jaxpr.outvars))))
  new = jaxpr.replace(invars=list(invars),
                      eqns=[e for e in jaxpr.eqns if id(e) not in dropped],
                      debug_info=info)
  return ClosedJaxpr(new, list(closed.consts))


def with_outvars(closed: Any, outvars: Sequence[Any]) -> Any:
  """``closed`` returning ``outvars`` (variables of it) instead of its
  outputs; equations, invars and constants unchanged."""
  jaxpr = closed.jaxpr
  info = jex_core.DebugInfo("tessel_jax outputs", "tessel_jax",
                            tuple(f"in{i}" for i in range(len(jaxpr.invars))),
                            tuple(f"out{i}" for i in range(len(outvars))))
  return ClosedJaxpr(jaxpr.replace(outvars=list(outvars), debug_info=info),
                     list(closed.consts))


# --- a build inside a caller's trace ------------------------------------------


@contextlib.contextmanager
def outside_traces() -> Iterator[None]:
  """Runs its body as at top level, outside every trace its caller is in.

  A step first called inside the user's ``jax.jit`` builds there: the
  build's example arrays (``jax.device_put`` of numpy values) and the
  kernels it times must be concrete values, not tracers of the caller's
  program. ``jax.ensure_compile_time_eval`` would also fold every
  constant-only equation of the blocks the build traces, each compiled on
  its own; this only leaves the caller's trace (traces opened inside, such
  as ``jax.make_jaxpr``, behave as at top level).
  """
  from jax._src import core as _core  # pylint: disable=import-outside-toplevel
  with _core.set_current_trace(_core.eval_trace):
    yield


def differentiated(x: Any) -> bool:
  """Whether ``x`` is a value being differentiated: a tracer of
  ``jax.grad`` / ``jax.vjp`` / ``jax.jvp`` / ``jax.linearize`` (also
  under ``jax.jit``)."""
  from jax._src.interpreters import ad as _ad  # pylint: disable=import-outside-toplevel
  return isinstance(x, (_ad.JVPTracer, _ad.LinearizeTracer))


# --- source locations in the lowered program's metadata -------------------------

#: Set to 1 to keep tessel_jax's own frames in the HLO's source locations.
KEEP_FRAMES_ENV = "TESSEL_JAX_SOURCE_FRAMES"


def hide_library_frames() -> None:
  """Leaves tessel_jax's own frames out of the source locations that JAX
  writes into a lowered program's metadata (as JAX does for its own).

  Every operation of a lowered program carries the Python stack it was
  traced under; the lowering's glue (stash reads and writes, tick tables,
  ppermutes) is traced deep inside ``passes``, so each distinct glue call
  site added its own stack of up to ten library frames to the HLO's
  ``StackFrames`` table: 29 of the 216 kchars of ``peer_bench``'s compact
  MLP. With the library's directories excluded, an operation's location is
  the user's line that traced it (the model line of a kernel, the call of
  the step for glue). Only source locations change: exception tracebacks
  keep every frame. ``TESSEL_JAX_SOURCE_FRAMES=1`` keeps the library frames
  (for debugging the lowering with a profiler).
  """
  import os  # pylint: disable=import-outside-toplevel

  from jax._src import source_info_util  # pylint: disable=import-outside-toplevel
  if os.environ.get(KEEP_FRAMES_ENV, "") not in ("", "0"):
    return
  from tessel_jax import passes  # pylint: disable=import-outside-toplevel
  for module_file in (__file__, passes.__file__):
    path = os.path.join(os.path.dirname(os.path.abspath(module_file)), "")
    if path not in source_info_util._exclude_paths:  # pylint: disable=protected-access
      source_info_util.register_exclusion(path)


hide_library_frames()
