"""FSDP (ZeRO-3) slots: gathered over the data axes, gradients scattered.

A slot class whose leaves' spec names data axes (``packing.SlotClass.fsdp``)
comes into the program's ``shard_map`` split over those axes: each data
replica stores its shard. Before the first tick the program gathers it
(``gather``: one ``all_gather`` per split dimension) and after the last it
reduces the accumulated gradient back to the shard (``scatter``: a
``psum`` over data axes the spec does not name, then one ``psum_scatter``
per split dimension). Both run outside every switch branch, where every
device of a data group runs the same program.

When the leaf is also split over GSPMD axes (``P(("data", "model"),
None)``), the collectives run inside a nested ``shard_map`` manual over
those axes too: left to GSPMD, a collective over the manual data axes
made XLA first gather the operand over ``model`` (measured: an
``all-gather`` of the whole weight per step), so each device would move
and hold the full weight.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import jax
from jax import lax
from jax.sharding import PartitionSpec as P

from tessel_jax import compat


def _auto_axes(spec: Sequence[Any]) -> frozenset[str]:
  """GSPMD axes named by spec entries (strings or tuples)."""
  out: set[str] = set()
  for e in spec:
    if e is not None:
      out.update(e if isinstance(e, tuple) else (e,))
  return frozenset(out)


def _on_shards(fn: Callable[[Any], Any], x: Any, spec: Sequence[Any]) -> Any:
  """``fn(x)`` with ``x``'s dimensions split by ``spec`` over GSPMD axes
  made manual (a nested ``shard_map``), so ``fn``'s collectives over the
  data axes move shards only."""
  axes = _auto_axes(spec)
  if not axes:
    return fn(x)
  full = P(*spec)
  inner = jax.shard_map(fn, mesh=compat.context_mesh(), in_specs=full,
                        out_specs=full, axis_names=set(axes),
                        check_vma=False)
  return inner(x)


def gather(x: Any, lead: int, fsdp: Sequence[Sequence[str]],
           inner_spec: Sequence[Any]) -> Any:
  """A stored FSDP slot gathered over its data axes.

  Args:
    x: The device's slot, ``lead`` leading dimensions then the leaf's shard.
    lead: Leading dimensions before the leaf's (pipe, slot stack).
    fsdp: Per leaf dimension, the data axes splitting it.
    inner_spec: Per leaf dimension, the GSPMD axes splitting it.

  Returns:
    ``x`` whole along the data axes (still split over the GSPMD axes).
  """

  def fn(a: Any) -> Any:
    for dim, axes in enumerate(fsdp):
      if axes:
        a = lax.all_gather(a, tuple(axes), axis=lead + dim, tiled=True)
    return a

  return _on_shards(fn, x, (None,) * lead + tuple(inner_spec))


def scatter(g: Any, lead: int, fsdp: Sequence[Sequence[str]],
            inner_spec: Sequence[Any], data_axes: Sequence[str]) -> Any:
  """A gathered-size gradient summed over ``data_axes``, this device's
  shard kept (``gather``'s transpose plus the data-parallel sum).

  Args:
    g: The device's gradient, ``lead`` leading dimensions then the leaf's.
    lead: Leading dimensions before the leaf's.
    fsdp: Per leaf dimension, the data axes splitting it.
    inner_spec: Per leaf dimension, the GSPMD axes splitting it.
    data_axes: Every data axis of the program.
  """
  named = {a for axes in fsdp for a in axes}
  rest = tuple(a for a in data_axes if a not in named)

  def fn(a: Any) -> Any:
    if rest:
      a = lax.psum(a, rest)
    for dim, axes in enumerate(fsdp):
      if axes:
        a = lax.psum_scatter(a, tuple(axes), scatter_dimension=lead + dim,
                             tiled=True)
    return a

  return _on_shards(fn, g, (None,) * lead + tuple(inner_spec))
