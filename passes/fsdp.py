"""FSDP (ZeRO-3) slots: gathered over the data axes, gradients scattered.

A slot class whose leaves' spec names data axes (``packing.SlotClass.fsdp``)
comes into the program's ``shard_map`` split over those axes: each data
replica stores its shard. Gathered per step (``Layout.fsdp_mode``; per
block: ``passes.fsdp_tick``, with the same ``gather`` and ``scatter``),
before the first tick the program gathers it
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

The module also holds the lowering's other placement helpers for split
and FSDP slots: the map's specs of the slot arrays (``slot_spec``), the
constraints inside (``pin``) and outside (``place``) the map, and the
gradients' output shardings (``out_shardings``).

``passes.gather`` gathers too, but a different thing: a leaf sharded over
the *pipe* axis, onto the devices of blocks that run on a strict subset of
that axis, with static ``ppermute``s (a collective over the pipe axis
cannot run in a branch, and ``all_gather`` moves it to every device); here
every device of a data group needs the whole slot, so one ``all_gather``
per split dimension is the mechanism. The two stay separate.
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


# --- placement of split and FSDP slots around the program's map --------------
# (The lowering's tensor-parallel / FSDP helpers: specs of the slot arrays,
# constraints outside and inside the map, the gradients' output shardings.)


def pin(x: Any, spec: Sequence[Any]) -> Any:
  """``x`` constrained to ``spec`` over the GSPMD axes (inside the map); a
  spec naming no axis leaves ``x`` alone."""
  if not any(e is not None for e in spec):
    return x
  return lax.with_sharding_constraint(x, P(*spec))


def place(mesh: Any, x: Any, spec: Sequence[Any],
          replicate: bool = False) -> Any:
  """``x`` constrained to ``spec`` on the whole ``mesh`` (outside the map);
  an empty spec leaves ``x`` to XLA unless ``replicate``."""
  if not replicate and not any(e is not None for e in spec):
    return x
  return lax.with_sharding_constraint(
      x, jax.sharding.NamedSharding(mesh, P(*spec)))


def leaf_specs(layout: Any) -> dict[int, tuple[Any, ...]]:
  """Leaves split over GSPMD (or data) axes -> their spec entries."""
  return {l: c.spec for c in layout.classes if c.spec
          for row in c.assign for l in row if l >= 0}


def slot_spec(c: Any, pipe: str, grads: bool = False) -> Any:
  """The map's spec of one slot array of class ``c`` (``grads``: of the
  class's stacked slot gradients): split over ``pipe``, and over the data
  axes for FSDP."""
  lead = (pipe, None) if grads else (pipe,)
  return P(*(lead + c.data_spec)) if c.fsdp else P(pipe)


def gather_slots(slots: Sequence[Sequence[Any]], classes: Sequence[Any]
                 ) -> list[list[Any]]:
  """FSDP slots (``(1, *shard)`` per device) gathered over their data axes
  (:func:`gather`), pinned to their GSPMD split; other slots unchanged."""
  return [[pin(gather(a, 1, c.fsdp, c.inner_spec), (None,) + c.inner_spec)
           for a in arrays] if c.fsdp else list(arrays)
          for arrays, c in zip(slots, classes)]


def reduce_slot_grads(g: Any, c: Any, data_axes: Sequence[str]) -> Any:
  """A class's slot gradients ``(1, S, *shape)`` summed over the data axes:
  a ``psum``, or for FSDP slots :func:`scatter` (the device's shard)."""
  if not c.fsdp:
    return lax.psum(g, tuple(data_axes))
  return scatter(g, 2, c.fsdp, c.inner_spec, data_axes)


def out_shardings(mesh: Any, layout: Any, param_avals: Sequence[Any],
                  param_tree: Any, pipe: str, train: bool) -> Any:
  """``jax.jit`` ``out_shardings`` on the user's ``mesh``: values
  replicated, each gradient with its parameter's sharding (a leaf sharded
  over the pipe axis: that axis on its sharded dimension). Needed for
  meshes with Explicit axes (the program itself runs on an all-Auto copy
  of the mesh, whose shardings would not mix with the user's arrays)."""
  rep = jax.sharding.NamedSharding(mesh, P())
  if not train:
    return rep
  specs = leaf_specs(layout)
  out = []
  for l, a in enumerate(param_avals):
    if l in layout.shards:
      ax, _ = layout.shards[l]
      spec = tuple(pipe if i == ax else None for i in range(a.ndim))
    else:
      spec = specs.get(l, ())
    out.append(jax.sharding.NamedSharding(mesh, P(*spec)))
  return rep, jax.tree_util.tree_unflatten(param_tree, out)
