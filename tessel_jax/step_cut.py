"""A scheduled step's function traced and cut into its placement's forward
blocks: the placement graph, the micro-batch trace, the cut (markers or
``passes.autocut``), the partition and the re-traces a split block runs.

Every function takes the ``ScheduledFunction`` (``step``) whose options it
reads; failures are ``step._error`` messages naming the fix.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import jax
import numpy as np

from tessel_jax import placements as _placements
from tessel_jax import trace_memo as _trace_memo
from tessel_jax.graph import BlockGraph, PlacementError
from tessel_jax.hand_placement import (Placement, fitting_placements,
                                       forward_count, forward_only,
                                       forward_reach)

try:  # installed: passes/ is tessel_jax.passes
  from tessel_jax.passes import align as _align  # type: ignore
  from tessel_jax.passes import autocut as _autocut  # type: ignore
  from tessel_jax.passes import errors as _errors  # type: ignore
  from tessel_jax.passes import partition as _partition  # type: ignore
  from tessel_jax.passes import tracing as _tracing  # type: ignore
except ImportError:  # run from the repository root
  from passes import align as _align  # type: ignore
  from passes import autocut as _autocut  # type: ignore
  from passes import errors as _errors  # type: ignore
  from passes import partition as _partition  # type: ignore
  from passes import tracing as _tracing  # type: ignore


def counts(step: Any, data_axes: Sequence[str]) -> tuple[int, int, int]:
  """``(pipe devices, N, N per data replica)`` with ``data_axes`` splitting
  the batch."""
  shape = dict(step.mesh.shape)
  num_devices = int(shape[step.pipe_axis])
  replicas = int(np.prod([shape[a] for a in data_axes])) if data_axes else 1
  n_total = int(step.num_microbatches)
  if n_total % replicas:
    raise step._error(  # pylint: disable=protected-access
        f"num_microbatches={n_total} does not divide over the"
        f" {replicas} data-parallel replicas of mesh axes {data_axes}; use a"
        f" multiple of {replicas}")
  return num_devices, n_total, n_total // replicas


def trace(step: Any, params: Any, batch: Any, n_total: int) -> tuple:
  """``(traced, rows, microbatch avals, param avals)`` of one micro-batch."""
  name = step.fn_name
  b_flat = jax.tree_util.tree_flatten_with_path(batch)[0]
  rows = _tracing.check_divisible(
      name, [jax.ShapeDtypeStruct(x.shape, x.dtype) for _, x in b_flat],
      n_total, [jax.tree_util.keystr(k) for k, _ in b_flat])
  microbatch = jax.tree_util.tree_map(
      lambda x: jax.ShapeDtypeStruct((rows,) + tuple(x.shape[1:]), x.dtype),
      batch)
  p_avals = jax.tree_util.tree_map(
      lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), params)
  traced = _trace_memo.trace(step.fn, name, p_avals, microbatch,
                             has_aux=step.has_aux,
                             dead_taps=step.switches.dead_taps)
  return traced, rows, microbatch, p_avals


def placement_source(step: Any, num_devices: int) -> BlockGraph | Placement:
  """``step.placement`` as a graph (named, given) or a hand ``Placement``."""
  p = step.placement
  if isinstance(p, str):
    try:
      return _placements.get(p, num_devices)
    except PlacementError as err:
      raise step._error(str(err)) from None  # pylint: disable=protected-access
  if isinstance(p, (BlockGraph, Placement)):
    return p
  if isinstance(p, (Mapping, Sequence)):
    return Placement(p)
  raise step._error(  # pylint: disable=protected-access
      f"placement must be a tj.placements graph, a tj.Placement, a name or"
      f" a list of device tuples per block; got {type(p).__name__}")


def partition_graph(step: Any, traced: Any, num_devices: int, train: bool,
                    split_leaves: bool = False
                    ) -> tuple[BlockGraph, Any, Any]:
  """The placement's graph, ``fn`` cut into its forward blocks and the
  cut trace (``split_leaves``: see ``cut``)."""
  source = placement_source(step, num_devices)
  if isinstance(source, Placement):
    return _hand_partition(step, source, traced, num_devices, split_leaves)
  graph = _checked_graph(step, source, num_devices, train)
  count = forward_count(graph)
  try:
    forward_of = {b.id: _placements.forward_index(b) for b in graph.blocks}
  except PlacementError as err:
    raise step._error(str(err)) from None  # pylint: disable=protected-access
  shared = {forward_of[b.id]: len(b.devices) for b in graph.blocks
            if b.kind == "F"}
  traced = cut(step, traced, count, f"placement {graph.name!r}",
               num_devices, [1.0 / shared.get(i, 1) for i in range(count)],
               split_leaves=split_leaves)
  return graph, _partition.partition(
      traced, forward_reach(graph, forward_of)), traced


def _hand_partition(step: Any, source: Placement, traced: Any,
                    num_devices: int, split_leaves: bool
                    ) -> tuple[BlockGraph, Any, Any]:
  """``partition_graph`` for a hand-made ``Placement``."""
  traced = cut(step, traced, source.num_blocks, "the hand-made Placement",
               num_devices, [1.0 / len(devs) for devs in source.devices],
               split_leaves=split_leaves)
  for devs in source.devices:
    for d in devs:
      if not 0 <= d < num_devices:
        raise step._error(  # pylint: disable=protected-access
            f"the Placement puts a block on device {d}, but the"
            f" {step.pipe_axis!r} axis has devices 0..{num_devices - 1}")
  part = _partition.partition(traced)
  return source.to_graph(num_devices, part.edges, step.mode), part, traced


def _checked_graph(step: Any, graph: BlockGraph, num_devices: int,
                   train: bool) -> BlockGraph:
  """``graph`` checked against the mesh and the mode (infer: its forward
  blocks only)."""
  fail = step._error  # pylint: disable=protected-access
  if graph.num_devices != num_devices:
    raise fail(
        f"placement {graph.name!r} is for {graph.num_devices} devices but"
        f" mesh axis {step.pipe_axis!r} has {num_devices}; build the"
        f" placement with {num_devices} devices")
  if not train:
    return forward_only(graph)
  if not any(b.kind == "B" for b in graph.blocks):
    raise fail(
        f"placement {graph.name!r} has no backward blocks, so it cannot"
        f" train; build it with mode='train' or call with mode='infer'")
  return graph


def local_parts(step: Any, graph: BlockGraph, rows: int, microbatch: Any,
                p_avals: Any, part: Any, traced: Any, reach: Any,
                num_devices: int) -> dict[int, Any]:
  """``g`` -> the partition of ``fn`` traced at ``rows / g`` rows, for
  every ``g`` sharing a forward block (what a split block runs), its
  blocks' exports and inputs paired with ``part``'s by where they are
  computed (``passes.align``). A ``g`` whose re-trace fails is left out:
  its blocks run replicated."""
  out = {}
  for g in sorted({len(b.devices) for b in graph.blocks if b.kind == "F"}):
    if g <= 1 or rows % g:
      continue
    local_mb = jax.tree_util.tree_map(
        lambda x, g=g: jax.ShapeDtypeStruct((rows // g,) + tuple(
            x.shape[1:]), x.dtype), microbatch)
    try:
      local = _trace_memo.trace(step.fn, step.fn_name, p_avals, local_mb,
                                has_aux=step.has_aux,
                                dead_taps=step.switches.dead_taps)
      local = cut(step, local, len(part.blocks), "", num_devices,
                  like=traced)
      out[g] = _align.align_partition(part,
                                      _partition.partition(local, reach))
    except (_errors.TesselError, TypeError, ValueError, IndexError):
      continue  # the function does not trace at rows / g: replicate
  return out


def cut(step: Any, traced: Any, count: int, what: str, num_devices: int,
        weights: Sequence[float] | None = None, like: Any = None,
        split_leaves: bool = False) -> Any:
  """``traced`` with ``count`` forward blocks: its markers or the auto cut.

  ``like``: the cut full-size trace, whose cut a re-trace (per-device rows
  of a shared block) reuses. ``split_leaves``: store a scanned stack's
  parameter leaves as one leaf per block's slice (``autocut.cut_to``).
  Parameter-only work is priced once per step only where the lowering
  hoists it (``Switches.hoist``, two micro-batches or more); measured
  costs time convolutions as the kernels bind them (``Switches.conv_forms``
  on a CPU mesh); with ``Switches.cut_accumulation`` the cut also prices
  the parameter-gradient adds.
  """
  markers = step.cut == "markers" or (step.cut is None and
                                      traced.num_blocks > 1)
  if markers and like is None and traced.num_blocks != count:
    raise count_error(step, traced.num_blocks, count, what, num_devices)
  return _autocut.cut_to(
      traced, count, fn_name=step.fn_name, cut=step.cut, like=like,
      cost="analytic" if step.cost == "uniform" else "measured",
      train=step.mode == "train", weights=weights,
      device=step.mesh.devices.flat[0], what=what,
      split_leaves=split_leaves, cache=step._costs.cache,
      hoist=step.switches.hoist and int(step.num_microbatches) >= 2,
      conv_forms=conv_forms(step),
      accumulation=step.switches.cut_accumulation)


def conv_forms(step: Any) -> bool:
  """Whether ``step``'s kernels bind their convolutions in XLA:CPU's
  canonical order (``Switches.conv_forms``, on CPU meshes only): the
  kernels and the measured cut's prices follow the same answer."""
  return (step.switches.conv_forms and
          str(step.mesh.devices.flat[0].platform) == "cpu")


def count_error(step: Any, have: int, want: int, what: str,
                num_devices: int) -> Exception:
  """The error for ``have`` marked blocks where the placement has ``want``."""
  fits = fitting_placements(have, num_devices)
  hint = (f"; placements with {have} forward blocks on {num_devices}"
          f" devices: {', '.join(fits)}" if fits else
          f"; no named placement has {have} forward blocks on"
          f" {num_devices} devices")
  diff = want - have
  change = (f"add {diff} tj.boundary call{'s' if diff > 1 else ''}" if diff > 0
            else f"remove {-diff} tj.boundary call{'s' if diff < -1 else ''}")
  return step._error(  # pylint: disable=protected-access
      f"the function has {have} blocks ({have - 1} tj.boundary calls) but"
      f" {what} has {want} forward blocks; {change}, remove every"
      f" tj.boundary (or pass cut='auto') to let tessel_jax cut the function"
      f" by cost, or pick a placement with {have} blocks{hint}")
