"""A timed group of the automatic cut, compiled as the ticks run kernels.

``passes.autocut_cost.measured_costs`` times contiguous groups of the traced
function's equations to price the cut. Compiled alone at the top of a
program, a group does not run as the lowered program runs the same
equations:

* the ticks run every kernel in a ``conditional`` branch or ``while`` body,
  where XLA's CPU backend neither canonicalises convolutions nor runs some
  other passes it runs at the top level (``passes.conv_forms``,
  ``tessel_jax.cost.tick_kernel``);
* on a CPU mesh with ``Switches.conv_forms`` the kernels bind their
  convolutions in XLA:CPU's canonical order (``passes.conv_forms``): a 3x3
  convolution on a 2x2 map, which XLA swaps into a generic loop at the top
  level (ResNet18's stage 2: 3.0 ms forward + backward per basic block
  there), runs as one dot (the basic block: 0.65 ms in a tick);
* ``passes.hoist`` computes the kernels' parameter-only values once per
  step (the dead-tap slices, which ``measured_costs`` already leaves out of
  the groups, and the weight transposes of the backward's convolutions,
  which only appear in the group's vjp).

:func:`tick_form` gives the group's function in that form: its
convolutions through ``conv_forms.conv`` (when asked), its parameter-only
values (``param_only.find`` on the traced group, parameters being the
function's parameters and the hoisted values the group reads) given as
inputs, the rest run in the taken branch of a ``lax.cond`` on a runtime
flag. ResNet18's stage-2 basic blocks cost 0.65-0.67 ms per micro-batch in
this form, 3.0 ms each compiled alone at the top level (BENCHMARKS.md,
helper "resnet10"): priced that way the cut put stage 2 on device 1.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp

from tessel_jax import compat

from . import conv_forms as _conv_forms
from . import param_only as _param_only


def evaluate(eqns: Sequence[Any], invars: Sequence[Any],
             outvars: Sequence[Any], args: Sequence[Any], *,
             conv_forms: bool) -> list[Any]:
  """``outvars`` of ``eqns`` on ``args`` (for ``invars``); with
  ``conv_forms``, the convolutions ``conv_forms.applies`` to bound through
  ``conv_forms.conv`` (forward and backward in the canonical order)."""
  if not conv_forms:
    return compat.eval_eqns(eqns, invars, outvars, args)
  env = dict(zip(invars, args))
  read = lambda v: compat.literal_value(v) if compat.is_literal(v) else env[v]
  for eqn in compat.retarget_constraints(list(eqns)):
    ins = [read(v) for v in eqn.invars]
    outs = ([_conv_forms.conv(*ins, eqn)] if _conv_forms.applies(eqn)
            else compat.bind_eqn(eqn, ins))
    env.update(zip(eqn.outvars, outs))
  return [read(v) for v in outvars]


def tick_form(fn: Callable[..., Any], args: Sequence[Any],
              is_param: Sequence[bool]) -> tuple[Callable[..., Any],
                                                 list[Any]]:
  """``(g, g_args)``: ``fn(*args)`` as a tick runs it.

  ``fn``'s parameter-only work (on the inputs ``is_param`` marks) is
  computed once from ``args`` into ``g_args`` (as ``passes.hoist`` stores
  it), and ``g(*g_args)`` runs the rest in the taken branch of a
  ``lax.cond`` on a flag (``g_args``' last, 1). ``g`` returns ``fn``'s
  flat outputs.
  """
  pi = [i for i, p in enumerate(is_param) if p]
  di = [i for i, p in enumerate(is_param) if not p]

  def split(pv: Sequence[Any], dv: Sequence[Any]) -> list[Any]:
    full: list[Any] = [None] * len(args)
    for i, x in zip(pi, pv):
      full[i] = x
    for i, x in zip(di, dv):
      full[i] = x
    return jax.tree_util.tree_leaves(fn(*full))

  pargs = [args[i] for i in pi]
  dargs = [args[i] for i in di]
  avals = lambda xs: [jax.ShapeDtypeStruct(x.shape, x.dtype) for x in xs]
  closed, _ = compat.make_jaxpr(split, avals(pargs), avals(dargs))
  invars, outvars = compat.jaxpr_io(closed)
  found = _param_only.find(closed, invars[:len(pargs)])
  hvals = _param_only.prelude(found, pargs) if found.hoisted else []
  outs = [(tuple(v.aval.shape), v.aval.dtype) for v in outvars]
  num_p, num_d = len(pargs), len(dargs)

  def g(*xs: Any) -> list[Any]:
    pv, dv = list(xs[:num_p]), list(xs[num_p:num_p + num_d])
    hv, flag = list(xs[num_p + num_d:-1]), xs[-1]
    zeros = lambda: [jnp.zeros(s, t) for s, t in outs]
    return jax.lax.cond(flag > 0,
                        lambda: _param_only.rest(found, pv + dv, hv), zeros)

  flag = jax.device_put(jnp.int32(1), _device_of(args))
  return g, pargs + dargs + list(jax.block_until_ready(hvals)) + [flag]


def _device_of(args: Sequence[Any]) -> Any:
  """The device of the first committed array among ``args``."""
  for x in args:
    devs = getattr(x, "devices", None)
    if devs is not None:
      return next(iter(devs()))
  return jax.devices()[0]


__all__ = ["evaluate", "tick_form"]
