"""Parameters sharded over the pipe axis: which, along what, read by whom.

``tessel_jax.schedule`` lets a parameter leaf be split along one dimension
over the devices of the pipe axis (a vocab-sharded embedding, say), given
by ``param_sharding=`` or by the leaves' own ``NamedSharding``. The specs
are checked here, each failure naming the leaf and the fix. A block on every
pipe device gathers such a leaf at its tick; blocks on a strict subset read
it gathered onto their devices before the first tick
(:func:`subset_readers`, ``passes.gather``).

Specs over the other mesh axes are split by :func:`resolve_axes` into data
axes and axes left to GSPMD, and checked by :func:`auto_specs`: a leaf split
over GSPMD axes stays split inside the blocks (tensor parallel); one split
over data axes is FSDP (ZeRO-3, ``passes.fsdp``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import jax
import numpy as np

Fail = Callable[[str], Exception]


def _leaf_names(params: Any) -> list[str]:
  return [jax.tree_util.keystr(k) for k, _ in
          jax.tree_util.tree_flatten_with_path(params)[0]]


def _specs(params: Any, param_sharding: Any, fail: Fail) -> list[Any]:
  """A ``PartitionSpec`` (or None) per parameter leaf: from
  ``param_sharding`` (a pytree matching ``params`` or a prefix of it) when
  given, else from the leaves' own ``NamedSharding``."""
  leaves = jax.tree_util.tree_leaves(params)
  spec_of: list[Any] = [None] * len(leaves)
  if param_sharding is None:
    for q, x in enumerate(leaves):
      try:
        sharding = getattr(x, "sharding", None)
      except Exception:  # pylint: disable=broad-except  (tracers)
        sharding = None
      if isinstance(sharding, jax.sharding.NamedSharding):
        spec_of[q] = sharding.spec
    return spec_of
  is_spec = lambda x: x is None or isinstance(x, jax.sharding.PartitionSpec)
  specs, spec_def = jax.tree_util.tree_flatten(param_sharding,
                                               is_leaf=is_spec)
  try:
    subtrees = spec_def.flatten_up_to(params)
  except (ValueError, TypeError) as err:
    raise fail(
        f"param_sharding must be a pytree of PartitionSpec (or None)"
        f" matching the params (or a prefix of them): {err}") from None
  pos = 0
  for spec, sub in zip(specs, subtrees):
    count = len(jax.tree_util.tree_leaves(sub))
    for q in range(pos, pos + count):
      spec_of[q] = spec
    pos += count
  if pos != len(leaves):
    raise fail("param_sharding does not cover every parameter leaf;"
               " give a PartitionSpec or None per leaf")
  return spec_of


def sharded_leaves(params: Any, param_sharding: Any, pipe_axis: str,
                   num_devices: int, fail: Fail) -> dict[int, int]:
  """Parameter leaves sharded over the pipe axis: leaf index -> dimension.

  Args:
    params: The parameter pytree (arrays or shape structs).
    param_sharding: A pytree of ``PartitionSpec`` / None matching
      ``params`` (or a prefix), or None to read the leaves' shardings.
    pipe_axis: The mesh axis the pipeline runs on.
    num_devices: Devices along ``pipe_axis``.
    fail: Makes the error to raise from a message naming the problem.

  Raises:
    The ``fail`` error: for a spec that shards a leaf over more than the
    pipe axis or along two dimensions, or along a dimension the device
    count does not divide.
  """
  leaves = jax.tree_util.tree_leaves(params)
  names = _leaf_names(params)
  out: dict[int, int] = {}
  for q, spec in enumerate(_specs(params, param_sharding, fail)):
    if spec is None:
      continue
    entries = tuple(spec)
    uses = [a for a, e in enumerate(entries)
            if e == pipe_axis or (isinstance(e, tuple) and pipe_axis in e)]
    if not uses:
      continue
    shape = tuple(leaves[q].shape)
    bad = [e for e in entries
           if e is not None and e != pipe_axis and e != (pipe_axis,)]
    if len(uses) > 1 or bad or len(entries) > len(shape):
      raise fail(
          f"parameter {names[q]} has sharding {spec}; tessel_jax shards a"
          f" parameter along one dimension over the pipe axis {pipe_axis!r}"
          f" only (e.g. PartitionSpec({pipe_axis!r}, None) for a"
          f" vocab-sharded embedding); use None for the other dimensions")
    ax = uses[0]
    if shape[ax] % num_devices:
      raise fail(
          f"parameter {names[q]} of shape {shape} is sharded along dimension"
          f" {ax} over the {num_devices} devices of {pipe_axis!r}, but"
          f" {shape[ax]} is not divisible by {num_devices}; pad it to a"
          f" multiple of {num_devices}")
    out[q] = ax
  return out


def subset_readers(shards: Mapping[int, int], kernel_set: Any,
                   num_devices: int) -> dict[int, tuple[int, ...]]:
  """Sharded leaves read by blocks on a strict subset of the pipe axis.

  Such a block cannot gather the leaf at its tick (a collective in a branch
  some devices skip would hang); the program gathers it onto the block's
  devices before the first tick and scatters its gradient back after the
  last (``passes.gather``).

  Args:
    shards: ``sharded_leaves``'s result.
    kernel_set: The kernels (``passes.kernels``), whose forward kernels name
      the parameter leaves they read and their devices.
    num_devices: Devices along the pipe axis.

  Returns:
    Leaf -> the devices of the strict-subset blocks reading it, sorted.
  """
  out: dict[int, set[int]] = {}
  for k in kernel_set.kernels.values():
    if k.kind != "F" or len(k.devices) == num_devices:
      continue
    for leaf in k.params:
      if leaf in shards:
        out.setdefault(leaf, set()).update(k.devices)
  return {l: tuple(sorted(devs)) for l, devs in sorted(out.items())}


def stored_params(kernel: Any, gathered: Mapping[int, Sequence[int]],
                  num_devices: int) -> tuple[int, ...]:
  """The leaves ``kernel`` reads from the parameter layout: all but the
  gathered ones when it runs on a strict subset of the pipe axis."""
  if len(kernel.devices) == num_devices:
    return tuple(kernel.params)
  return tuple(l for l in kernel.params if l not in gathered)


def _named_axes(entry: Any) -> tuple[str, ...]:
  """Mesh axes one ``PartitionSpec`` entry names (None: none)."""
  if entry is None:
    return ()
  if isinstance(entry, (tuple, list)):
    return tuple(entry)
  return (entry,)


def spec_axes(params: Any, param_sharding: Any, fail: Fail) -> set[str]:
  """Every mesh axis some parameter's sharding names."""
  out: set[str] = set()
  for spec in _specs(params, param_sharding, fail):
    for e in tuple(spec) if spec is not None else ():
      out.update(_named_axes(e))
  return out


def resolve_axes(mesh_axes: tuple[str, ...], pipe_axis: str,
                 data_axes: Any, used: set[str], fail: Fail
                 ) -> tuple[tuple[str, ...], tuple[str, ...], str | None]:
  """Splits the mesh axes besides the pipe axis into data and GSPMD axes.

  Args:
    mesh_axes: The mesh's axis names, in order.
    pipe_axis: The pipeline axis.
    data_axes: The user's ``data_axes=`` (None: not given).
    used: Mesh axes named by some parameter's sharding (``spec_axes``).
    fail: Makes the error to raise from a message naming the problem.

  Returns:
    ``(data, auto, warning)``: the axes that split the batch and the axes
    left to GSPMD, both in mesh order, and a warning to show (None when
    ``data_axes`` was given or the mesh has no other axes). Without
    ``data_axes`` the axes some parameter is sharded over are left to GSPMD
    and the rest split the batch, as before ``data_axes`` existed.
  """
  others = tuple(a for a in mesh_axes if a != pipe_axis)
  if data_axes is None:
    data = tuple(a for a in others if a not in used)
    auto = tuple(a for a in others if a in used)
    warning = None
    if others:
      warning = (f"data_axes is not given, so mesh axes {data} split the batch"
                 f" (data parallel)"
                 + (f" and {auto}, which parameter shardings name, are left"
                    f" to GSPMD (tensor parallel)" if auto else "")
                 + f"; pass data_axes={data!r} to say so and silence this"
                 f" warning, or data_axes=() to leave every axis besides"
                 f" {pipe_axis!r} to GSPMD")
    return data, auto, warning
  if isinstance(data_axes, str):
    data_axes = (data_axes,)
  data_axes = tuple(data_axes)
  for a in data_axes:
    if a == pipe_axis or a not in mesh_axes:
      raise fail(
          f"data_axes names {a!r}, which is "
          + ("the pipe axis" if a == pipe_axis else
             f"not an axis of the mesh {tuple(mesh_axes)}")
          + f"; name mesh axes besides {pipe_axis!r}, e.g."
          f" data_axes={tuple(x for x in others)[:1]!r}")
  if len(set(data_axes)) != len(data_axes):
    raise fail(f"data_axes={data_axes!r} names an axis twice")
  data = tuple(a for a in mesh_axes if a in data_axes)
  return data, tuple(a for a in others if a not in data_axes), None


def auto_specs(params: Any, param_sharding: Any, pipe_axis: str,
               data_axes: tuple[str, ...], auto_axes: tuple[str, ...],
               fail: Fail, mesh_shape: Mapping[str, int] | None = None
               ) -> dict[int, tuple[Any, ...]]:
  """Parameter leaves sharded over GSPMD or data axes: leaf -> spec entries.

  The returned entries have one per dimension of the leaf (None where the
  dimension is not split). A leaf split over auto axes only keeps its
  sharding inside the blocks; a leaf whose spec also names data axes is
  FSDP-sharded (ZeRO-3): each data replica stores its shard, the program
  gathers it over the data axes before the first tick and reduce-scatters
  its gradient after the last (``passes.lower``). Either way its gradient
  comes back with the leaf's sharding.

  Args:
    params: The parameter pytree (arrays or shape structs).
    param_sharding: As for ``sharded_leaves``.
    pipe_axis: The pipeline axis (leaves naming it are ``sharded_leaves``'s).
    data_axes: Mesh axes that split the batch.
    auto_axes: Mesh axes left to GSPMD.
    fail: Makes the error to raise from a message naming the problem.
    mesh_shape: Axis sizes, to check that data-split dimensions divide.

  Raises:
    The ``fail`` error: for a spec naming an axis not in the mesh, a spec
    longer than the leaf's rank, an entry listing a GSPMD axis before a data
    axis, or a data-split dimension the axes' devices do not divide.
  """
  leaves = jax.tree_util.tree_leaves(params)
  names = _leaf_names(params)
  out: dict[int, tuple[Any, ...]] = {}
  for q, spec in enumerate(_specs(params, param_sharding, fail)):
    if spec is None:
      continue
    entries = tuple(spec)
    axes = [a for e in entries for a in _named_axes(e)]
    if pipe_axis in axes:
      continue  # sharded_leaves checks and lays it out
    for a in axes:
      if a not in auto_axes and a not in data_axes:
        raise fail(f"parameter {names[q]} has sharding {spec}, naming {a!r},"
                   f" which is not an axis of the mesh")
    shape = tuple(leaves[q].shape)
    if len(entries) > len(shape):
      raise fail(f"parameter {names[q]} of shape {shape} has sharding {spec}"
                 f" with more entries than dimensions; give one entry (or"
                 f" None) per dimension")
    for dim, e in enumerate(entries):
      _check_fsdp_entry(names[q], spec, shape, dim, _named_axes(e),
                        data_axes, mesh_shape, fail)
    if axes:
      out[q] = entries + (None,) * (len(shape) - len(entries))
  return out


def _check_fsdp_entry(name: str, spec: Any, shape: tuple[int, ...], dim: int,
                      axes: tuple[str, ...], data_axes: tuple[str, ...],
                      mesh_shape: Mapping[str, int] | None, fail: Fail
                      ) -> None:
  """Refuses one spec entry an FSDP leaf cannot be stored with: a GSPMD
  axis before a data axis, or a dimension its axes do not divide."""
  data = [i for i, a in enumerate(axes) if a in data_axes]
  if not data:
    return
  if data != list(range(len(data))):
    fixed = tuple(sorted(axes, key=lambda a: a not in data_axes))
    raise fail(
        f"parameter {name} has sharding {spec}, whose dimension {dim} lists"
        f" {axes}: a GSPMD axis before a data axis; list the data axes first"
        f" ({fixed!r}) to shard it over both (FSDP x tensor parallel)")
  if mesh_shape is None:
    return
  pieces = int(np.prod([mesh_shape[a] for a in axes]))
  if shape[dim] % pieces:
    raise fail(
        f"parameter {name} of shape {shape} has sharding {spec}, splitting"
        f" dimension {dim} ({shape[dim]}) into {pieces} pieces over {axes},"
        f" which does not divide; pad it to a multiple of {pieces} or shard"
        f" another dimension over the data axes")


