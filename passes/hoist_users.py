"""Hoisted parameter-only values computed only on the devices that read them.

``passes.hoist.prepare`` computes every hoistable kernel's parameter-only
values (a dead-tap kernel slice, a weight transposed for its input gradient)
once per step before the ticks. The body is one program for every device,
so without this each device computed every value, also those of kernels
that run only on another device, from its own (unused) slots or region:
ResNet18's placed step had device 0 slice and transpose device 1's seven
stage-3/4 weights every step. With ``Switches.hoist_on_users`` (on) the
values whose readers run on a subset of the devices are computed under one
``lax.cond`` per subset: on the other devices the branch writes zeros of
the same shapes (the value is never read there, but the program needs
one). XLA still copies a transposed value into its loop layout after the
``cond``, on every device.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Hashable, Mapping, Sequence
from typing import Any

import jax
import jax.numpy as jnp
from jax import lax

from tessel_jax import compat

from . import param_only as _po


@dataclasses.dataclass(frozen=True, eq=False)
class Value:
  """One hoisted value to compute.

  Attributes:
    eqns: Its producing equations (``param_only.value_prelude``).
    reads: The parameter variables they read.
    var: The value's variable.
    stored: How it is stored (``param_only.Found.stored``).
    args: The arrays bound to ``reads``.
    devices: The devices whose kernels read it.
  """

  eqns: Sequence[Any]
  reads: Sequence[Any]
  var: Any
  stored: Any
  args: Sequence[Any]
  devices: frozenset[int]


def _compute(values: Sequence[Value], args: Sequence[Sequence[Any]]
             ) -> list[Any]:
  """The values from their parameter arrays, as stored."""
  return [_po.store(compat.eval_eqns(v.eqns, v.reads, [v.var], a)[0],
                    v.stored) for v, a in zip(values, args)]


def compute(values: Mapping[Hashable, Value], dev: Any, num_devices: int,
            on_users: bool = True) -> dict[Hashable, Any]:
  """Every value by key; with ``on_users`` (``Switches.hoist_on_users``)
  those read on a subset of the ``num_devices`` devices computed under a
  ``lax.cond`` on ``dev`` (zeros elsewhere), one per subset."""
  groups: dict[frozenset[int], list[Hashable]] = {}
  for key, v in values.items():
    whole = not on_users or len(v.devices) >= num_devices
    groups.setdefault(frozenset() if whole else v.devices, []).append(key)
  out: dict[Hashable, Any] = {}
  for devices, keys in groups.items():
    vals = [values[k] for k in keys]
    args = [list(v.args) for v in vals]
    if not devices:
      got = _compute(vals, args)
    else:
      member = functools.reduce(jnp.logical_or,
                                [dev == d for d in sorted(devices)])
      got = lax.cond(member, functools.partial(_compute, vals),
                     functools.partial(_zeros, vals), args)
    out.update(zip(keys, got))
  return out


def _zeros(values: Sequence[Value], args: Sequence[Sequence[Any]]
           ) -> list[Any]:
  """Zeros shaped as the stored values (the branch of devices that do not
  read them)."""
  shapes = jax.eval_shape(functools.partial(_compute, values), args)
  return [jnp.zeros(s.shape, s.dtype) for s in shapes]
