"""Named operator placements: builders that return validated BlockGraphs.

Every builder takes the number of devices ``D`` on the pipeline axis and
returns the BlockGraph of ONE micro-batch for that placement::

  vshape(num_devices, mode="train", f_span=1, b_span=3,
         split_backward=False, w_span=1) -> BlockGraph

``mode`` is ``"train"`` (forward and backward blocks) or ``"infer"`` (forward
blocks only, every memory 0). Training memory follows Tessel's convention:
each forward block adds +1 on each of its devices and its backward block
releases it (-1). With ``split_backward=True`` the backward is split into an
input-gradient block ``B`` (span ``b_span``) and a weight-gradient block ``W``
(span ``w_span``): ``F`` adds +2, ``B`` and ``W`` release 1 each; each ``W``
depends on its ``B`` only, and the chain of ``B`` blocks does not wait for any
``W``.

Id and name convention (the lowering relies on it):

* forward blocks get ids ``0 .. nF-1`` in forward program order (a
  topological order of the forward DAG) and are named ``F{i}``;
* the backward of forward block ``i`` is named ``B{i}`` and runs on the same
  devices as ``F{i}``; its weight-gradient block (split backward) is ``W{i}``;
* ``B`` ids follow the forward ids (``nF ..``) in reverse forward order, then
  the ``W`` ids in the same reverse order;
* a forward block with no gradient (a frozen block, a no-grad recycling pass)
  has no ``B`` and no ``W``.

Backward edges mirror the forward edges between blocks that have a gradient
(``Fu -> Fv`` gives ``Bv -> Bu``); every forward block with a gradient but no
successor with a gradient feeds its own backward (``Fi -> Bi``), which is how
the last forward block(s) feed the first backward block(s).

The pictures in the builders' docstrings show one micro-batch for ``D = 4``
run as early as possible with every span 1: one row per device, one column per
step; a block on several devices appears on each of their rows.

No jax, no ortools here (DESIGN.md §2).
"""

from __future__ import annotations

import dataclasses
import inspect
import re
from collections.abc import Callable, Sequence

from tessel_jax import checks
from tessel_jax.graph import Block, BlockGraph, Edge, PlacementError

MODES = ("train", "infer")

_NAME_RE = re.compile(r"^([FBW])(\d+)$")


# --- naming helpers ----------------------------------------------------------

def forward_index(block: Block) -> int:
  """Index ``i`` of the forward block that ``block`` belongs to.

  Parses the ``F{i}`` / ``B{i}`` / ``W{i}`` name of the convention: ``F3``,
  ``B3`` and ``W3`` all give 3.

  Raises:
    PlacementError: if the name does not follow the convention or its letter
      disagrees with the block's kind.
  """
  match = _NAME_RE.match(block.name)
  if match is None:
    raise PlacementError(
        f"block {block.id} is named {block.name!r}; the placement convention"
        " needs names F{i}, B{i} or W{i} (build the graph with"
        " tessel_jax.placements or name the blocks that way)")
  if match.group(1) != block.kind:
    raise PlacementError(
        f"block {block.id} is named {block.name!r} but has kind"
        f" {block.kind!r}; the name's letter must be the kind")
  return int(match.group(2))


def backward_of(graph: BlockGraph) -> dict[int, int]:
  """Maps every ``B``/``W`` block id to the id of its forward block.

  Raises:
    PlacementError: if a name breaks the convention or a ``B{i}``/``W{i}``
      has no ``F{i}`` in ``graph``.
  """
  forward_ids: dict[int, int] = {}
  for b in graph.blocks:
    if b.kind == "F":
      forward_ids[forward_index(b)] = b.id
  out: dict[int, int] = {}
  for b in graph.blocks:
    if b.kind == "F":
      continue
    index = forward_index(b)
    if index not in forward_ids:
      raise PlacementError(
          f"placement {graph.name!r}: block {b.name} has no forward block"
          f" F{index}; every B{{i}}/W{{i}} needs its F{{i}}")
    out[b.id] = forward_ids[index]
  return out


# --- the generic builder -----------------------------------------------------

@dataclasses.dataclass(frozen=True)
class _Fwd:
  """One forward block before ids are assigned.

  Attributes:
    devices: Devices of the block.
    grad: Whether the block has a backward (False: frozen / no-grad pass).
    holds: Whether it keeps its activation until its backward (False: memory
      0 in forward and backward; the backward recomputes it).
    extra_b_span: Steps added to its backward's span (recomputation).
  """

  devices: tuple[int, ...]
  grad: bool = True
  holds: bool = True
  extra_b_span: int = 0


def _check_common(shape: str, num_devices: int, mode: str, spans: dict[str, int]
                  ) -> int:
  """Checks the arguments every builder takes; returns ``num_devices``."""
  num_devices = checks.integer(num_devices, "num_devices", low=1, high=checks.MAX_DEVICES,
                 where=shape, error=PlacementError,
                 fix="the search models at most that many devices per"
                 " pipeline")
  if not isinstance(mode, str) or mode not in MODES:
    raise PlacementError(
        f"{shape}: mode is {mode!r}; use 'train' (forward and backward) or"
        " 'infer' (forward only)")
  for key, value in spans.items():
    checks.integer(value, key, low=1, high=checks.MAX_SPAN, where=shape,
                   error=PlacementError, fix="spans are integer time steps")
  return num_devices


def _build(shape: str, num_devices: int, mode: str, forwards: Sequence[_Fwd],
           edges: Sequence[tuple[int, int]], f_span: int, b_span: int,
           split_backward: bool, w_span: int) -> BlockGraph:
  """Assigns ids and names, derives the backward and validates the graph.

  Args:
    shape: Placement name (first part of the graph name).
    num_devices: Devices on the pipeline axis.
    mode: ``"train"`` or ``"infer"``.
    forwards: Forward blocks in forward program order (ids 0..).
    edges: Forward edges as ``(src, dst)`` forward indices.
    f_span, b_span, w_span: Spans of F, B and W blocks.
    split_backward: Split every backward into B and W.
  """
  _check_common(shape, num_devices, mode,
                {"f_span": f_span, "b_span": b_span, "w_span": w_span})
  num_devices, f_span, b_span, w_span = (
      int(num_devices), int(f_span), int(b_span), int(w_span))
  train = mode == "train"
  num_f = len(forwards)
  f_mem = 2 if split_backward else 1
  blocks = []
  for i, fwd in enumerate(forwards):
    memory = f_mem if (train and fwd.grad and fwd.holds) else 0
    blocks.append(Block(i, "F", f_span, memory, tuple(fwd.devices), f"F{i}"))
  all_edges = [Edge(s, d) for s, d in edges]
  if train:
    grads = [i for i in reversed(range(num_f)) if forwards[i].grad]
    b_id = {i: num_f + k for k, i in enumerate(grads)}
    w_id = ({i: num_f + len(grads) + k for k, i in enumerate(grads)}
            if split_backward else {})
    for i in grads:
      fwd = forwards[i]
      blocks.append(Block(b_id[i], "B", b_span + fwd.extra_b_span,
                          -1 if fwd.holds else 0, tuple(fwd.devices), f"B{i}"))
    for i in grads if split_backward else ():
      fwd = forwards[i]
      blocks.append(Block(w_id[i], "W", w_span, -1 if fwd.holds else 0,
                          tuple(fwd.devices), f"W{i}"))
    grad_succ = {i: [d for s, d in edges if s == i and forwards[d].grad]
                 for i in grads}
    for s, d in edges:
      if forwards[s].grad and forwards[d].grad:
        all_edges.append(Edge(b_id[d], b_id[s]))
    for i in grads:
      if not grad_succ[i]:
        all_edges.append(Edge(i, b_id[i]))
    for i in grads if split_backward else ():
      all_edges.append(Edge(b_id[i], w_id[i]))
  return BlockGraph(name=f"{shape}.{mode}.d{num_devices}",
                    num_devices=num_devices, blocks=tuple(blocks),
                    edges=tuple(all_edges))


def _chain(start: int, count: int) -> list[tuple[int, int]]:
  """Edges of a chain over forward indices ``start .. start+count-1``."""
  return [(i, i + 1) for i in range(start, start + count - 1)]


def _all(num_devices: int) -> tuple[int, ...]:
  return tuple(range(num_devices))


# --- placements --------------------------------------------------------------

def vshape(num_devices: int, mode: str = "train", f_span: int = 1,
           b_span: int = 3, split_backward: bool = False,
           w_span: int = 1) -> BlockGraph:
  """V-shape (the 1F1B / GPipe placement): stage i on device i.

  Forward chain ``F0 .. F{D-1}`` with ``Fi`` on device ``i``; backward
  ``B{D-1} .. B0`` mirrored::

    dev0  F0 .  .  .  .  .  .  B0
    dev1  .  F1 .  .  .  .  B1 .
    dev2  .  .  F2 .  .  B2 .  .
    dev3  .  .  .  F3 B3 .  .  .

  Args:
    num_devices: Devices ``D`` (>= 1).
    mode: ``"train"`` or ``"infer"``.
    f_span: Span of every forward block.
    b_span: Span of every backward block (input gradient when split).
    split_backward: Split every backward into ``B`` and ``W``.
    w_span: Span of every ``W`` block (split backward only).
  """
  d = num_devices
  d = _check_common("vshape", d, mode, {})
  forwards = [_Fwd((i,)) for i in range(d)]
  return _build("vshape", d, mode, forwards, _chain(0, d), f_span, b_span,
                split_backward, w_span)


def interleaved(num_devices: int, mode: str = "train", f_span: int = 1,
                b_span: int = 3, split_backward: bool = False,
                w_span: int = 1, *, chunks: int = 2) -> BlockGraph:
  """Megatron interleaved placement: ``chunks`` model chunks per device.

  Forward stages ``s = 0 .. chunks*D - 1`` form one chain, stage ``s`` on
  device ``s % D``. ``chunks=1`` is the V-shape. For ``chunks=2``::

    dev0  F0 .  .  .  F4 .  .  .  .  .  .  B4 .  .  .  B0
    dev1  .  F1 .  .  .  F5 .  .  .  .  B5 .  .  .  B1 .
    dev2  .  .  F2 .  .  .  F6 .  .  B6 .  .  .  B2 .  .
    dev3  .  .  .  F3 .  .  .  F7 B7 .  .  .  B3 .  .  .

  The graph is named ``interleaved.<mode>.d<D>`` for 2 chunks and
  ``interleaved_c<chunks>.<mode>.d<D>`` otherwise.

  Args:
    num_devices: Devices ``D`` (>= 1).
    mode, f_span, b_span, split_backward, w_span: As in :func:`vshape`.
    chunks: Model chunks (virtual stages) per device (>= 1).
  """
  d = num_devices
  d = _check_common("interleaved", d, mode, {})
  chunks = checks.integer(chunks, "chunks", low=1,
                          high=max(1, checks.MAX_BLOCKS // (2 * d)),
                          where="interleaved", error=PlacementError,
                          fix="the placement would exceed"
                          f" {checks.MAX_BLOCKS} blocks")
  shape = "interleaved" if chunks == 2 else f"interleaved_c{chunks}"
  stages = chunks * d
  forwards = [_Fwd((s % d,)) for s in range(stages)]
  return _build(shape, d, mode, forwards, _chain(0, stages), f_span, b_span,
                split_backward, w_span)


def xshape(num_devices: int, mode: str = "train", f_span: int = 1,
           b_span: int = 3, split_backward: bool = False,
           w_span: int = 1) -> BlockGraph:
  """X-shape (Chimera-like): two independent V's in one micro-batch.

  Chain A ``F0 .. F{D-1}`` runs over devices ``0 .. D-1``; chain B
  ``F{D} .. F{2D-1}`` runs over devices ``D-1 .. 0``. There is no edge
  between the chains; each has its own mirrored backward::

    dev0  F0 .  .  F7 B7 .  .  B0
    dev1  .  F1 F6 .  .  B6 B1 .
    dev2  .  F5 F2 .  .  B2 B5 .
    dev3  F4 .  .  F3 B3 .  .  B4
  """
  d = num_devices
  d = _check_common("xshape", d, mode, {})
  forwards = ([_Fwd((i,)) for i in range(d)] +
              [_Fwd((d - 1 - i,)) for i in range(d)])
  edges = _chain(0, d) + _chain(d, d)
  return _build("xshape", d, mode, forwards, edges, f_span, b_span,
                split_backward, w_span)


def mshape(num_devices: int, mode: str = "train", f_span: int = 1,
           b_span: int = 3, split_backward: bool = False,
           w_span: int = 1) -> BlockGraph:
  """M-shape: an all-device block, then a chain, backward, then its backward.

  ``F0`` runs on all devices (e.g. a tensor-parallel embedding), then
  ``F1 .. FD`` with ``F{i+1}`` on device ``i``; the backward mirrors it and
  ``B0`` (all devices) runs last::

    dev0  F0 F1 .  .  .  .  .  .  B1 B0
    dev1  F0 .  F2 .  .  .  .  B2 .  B0
    dev2  F0 .  .  F3 .  .  B3 .  .  B0
    dev3  F0 .  .  .  F4 B4 .  .  .  B0
  """
  d = num_devices
  d = _check_common("mshape", d, mode, {})
  forwards = [_Fwd(_all(d))] + [_Fwd((i,)) for i in range(d)]
  return _build("mshape", d, mode, forwards, _chain(0, d + 1), f_span, b_span,
                split_backward, w_span)


def kshape(num_devices: int, mode: str = "train", f_span: int = 1,
           b_span: int = 3, split_backward: bool = False,
           w_span: int = 1) -> BlockGraph:
  """K-shape: two parallel branches joined by an all-device block.

  ``D`` must be even; ``h = D/2``. Branch A ``F0 .. F{h-1}`` runs on devices
  ``0 .. h-1``, branch B ``F{h} .. F{D-1}`` on devices ``h .. D-1`` (both are
  sources, they run in parallel); ``F{D}`` on all devices depends on both
  branch ends. The backward mirrors it (``B{D}`` first, then both branches)::

    dev0  F0 .  F4 B4 .  B0
    dev1  .  F1 F4 B4 B1 .
    dev2  F2 .  F4 B4 .  B2
    dev3  .  F3 F4 B4 B3 .

  Raises:
    PlacementError: if ``D`` is odd.
  """
  d = num_devices
  d = _check_common("kshape", d, mode, {})
  if d % 2:
    raise PlacementError(
        f"kshape splits the devices into two equal branches, so it needs an"
        f" even number of devices (2, 4, 6, 8, ...); got {d}")
  h = d // 2
  forwards = ([_Fwd((i,)) for i in range(d)] + [_Fwd(_all(d))])
  edges = _chain(0, h) + _chain(h, h) + [(h - 1, d), (d - 1, d)]
  return _build("kshape", d, mode, forwards, edges, f_span, b_span,
                split_backward, w_span)


def _nn_forwards(d: int, eager: bool
                 ) -> tuple[list[_Fwd], list[tuple[int, int]]]:
  def all_block() -> _Fwd:
    return _Fwd(_all(d), holds=not eager)
  forwards = ([_Fwd((i,)) for i in range(d)] + [all_block()] +
              [_Fwd((i,)) for i in range(d)] + [all_block()])
  return forwards, _chain(0, 2 * d + 2)


def nnshape(num_devices: int, mode: str = "train", f_span: int = 1,
            b_span: int = 3, split_backward: bool = False,
            w_span: int = 1) -> BlockGraph:
  """NN-shape: two "N" strokes, chain + all-device block, twice.

  One chain ``F0 .. F{2D+1}``: ``F0 .. F{D-1}`` on devices ``0 .. D-1``,
  ``F{D}`` on all devices, ``F{D+1} .. F{2D}`` on devices ``0 .. D-1``,
  ``F{2D+1}`` on all devices. Backward mirrored::

    dev0  F0 .  .  .  F4 F5 .  .  .  F9 B9 .  .  .  B5 B4 .  .  .  B0
    dev1  .  F1 .  .  F4 .  F6 .  .  F9 B9 .  .  B6 .  B4 .  .  B1 .
    dev2  .  .  F2 .  F4 .  .  F7 .  F9 B9 .  B7 .  .  B4 .  B2 .  .
    dev3  .  .  .  F3 F4 .  .  .  F8 F9 B9 B8 .  .  .  B4 B3 .  .  .
  """
  d = num_devices
  d = _check_common("nnshape", d, mode, {})
  forwards, edges = _nn_forwards(d, eager=False)
  return _build("nnshape", d, mode, forwards, edges, f_span, b_span,
                split_backward, w_span)


def nnshape_eager(num_devices: int, mode: str = "train", f_span: int = 1,
                  b_span: int = 3, split_backward: bool = False,
                  w_span: int = 1, recompute_span: int | None = None
                  ) -> BlockGraph:
  """NN-shape whose all-device blocks release memory eagerly.

  Same blocks, ids, names, devices and edges as :func:`nnshape`. Exactly two
  things differ, both only for the two all-device blocks ``F{D}`` and
  ``F{2D+1}`` and only in training mode:

  1. they keep no activation: memory 0 in ``F``, ``B`` (and ``W``), so a
     device's memory never counts them;
  2. their backward recomputes the forward, so their ``B`` span is
     ``b_span + recompute_span`` (``recompute_span`` defaults to ``f_span``;
     pass 0 to model free recomputation). ``W`` spans are unchanged.

  Picture (training, every span 1, ``recompute_span=0``) as for nnshape::

    dev0  F0 .  .  .  F4 F5 .  .  .  F9 B9 .  .  .  B5 B4 .  .  .  B0
    dev1  .  F1 .  .  F4 .  F6 .  .  F9 B9 .  .  B6 .  B4 .  .  B1 .
    dev2  .  .  F2 .  F4 .  .  F7 .  F9 B9 .  B7 .  .  B4 .  B2 .  .
    dev3  .  .  .  F3 F4 .  .  .  F8 F9 B9 B8 .  .  .  B4 B3 .  .  .

  The graph is named ``nnshape_eager.<mode>.d<D>``.
  """
  d = num_devices
  d = _check_common("nnshape_eager", d, mode, {})
  extra = f_span if recompute_span is None else recompute_span
  if isinstance(extra, bool) or not isinstance(extra, int) or extra < 0:
    raise PlacementError(
        f"nnshape_eager: recompute_span must be an integer >= 0, got"
        f" {recompute_span!r}")
  forwards, edges = _nn_forwards(d, eager=True)
  forwards = [dataclasses.replace(f, extra_b_span=extra) if not f.holds else f
              for f in forwards]
  return _build("nnshape_eager", d, mode, forwards, edges, f_span, b_span,
                split_backward, w_span)


def mllm(num_devices: int, mode: str = "train", f_span: int = 1,
         b_span: int = 3, split_backward: bool = False,
         w_span: int = 1) -> BlockGraph:
  """Multimodal LLM: all-device encoder, chain over devices, all-device head.

  ``F0`` on all devices, ``F1 .. FD`` with ``F{i+1}`` on device ``i``,
  ``F{D+1}`` on all devices; backward mirrored::

    dev0  F0 F1 .  .  .  F5 B5 .  .  .  B1 B0
    dev1  F0 .  F2 .  .  F5 B5 .  .  B2 .  B0
    dev2  F0 .  .  F3 .  F5 B5 .  B3 .  .  B0
    dev3  F0 .  .  .  F4 F5 B5 B4 .  .  .  B0
  """
  d = num_devices
  d = _check_common("mllm", d, mode, {})
  forwards = [_Fwd(_all(d))] + [_Fwd((i,)) for i in range(d)] + [_Fwd(_all(d))]
  return _build("mllm", d, mode, forwards, _chain(0, d + 2), f_span, b_span,
                split_backward, w_span)


def finetune(num_devices: int, mode: str = "train", f_span: int = 1,
             b_span: int = 2, split_backward: bool = False,
             w_span: int = 1) -> BlockGraph:
  """Fine-tuning: a frozen all-device block, then a trained chain.

  ``F0`` runs on all devices with no gradient (frozen: memory 0, no ``B``);
  ``F1 .. FD`` with ``F{i+1}`` on device ``i`` are trained. ``b_span``
  defaults to 2 (no gradient flows into the frozen part)::

    dev0  F0 F1 .  .  .  .  .  .  B1
    dev1  F0 .  F2 .  .  .  .  B2 .
    dev2  F0 .  .  F3 .  .  B3 .  .
    dev3  F0 .  .  .  F4 B4 .  .  .
  """
  d = num_devices
  d = _check_common("finetune", d, mode, {})
  forwards = [_Fwd(_all(d), grad=False)] + [_Fwd((i,)) for i in range(d)]
  return _build("finetune", d, mode, forwards, _chain(0, d + 1), f_span,
                b_span, split_backward, w_span)


def alphafold(num_devices: int, mode: str = "train", f_span: int = 1,
              b_span: int = 3, split_backward: bool = False,
              w_span: int = 1) -> BlockGraph:
  """AlphaFold-style recycling: three forward passes, backward of the last.

  One chain of three passes over devices ``0 .. D-1``: ``F0 .. F{D-1}`` and
  ``F{D} .. F{2D-1}`` are no-grad recycling passes (memory 0, no ``B``),
  ``F{2D} .. F{3D-1}`` is the trained pass with its mirrored backward; each
  pass's last block feeds the next pass's first::

    dev0  F0  .   .   .   F4  .   .   .   F8  .   .   .   .   .   .   B8
    dev1  .   F1  .   .   .   F5  .   .   .   F9  .   .   .   .   B9  .
    dev2  .   .   F2  .   .   .   F6  .   .   .   F10 .   .   B10 .   .
    dev3  .   .   .   F3  .   .   .   F7  .   .   .   F11 B11 .   .   .
  """
  d = num_devices
  d = _check_common("alphafold", d, mode, {})
  forwards = ([_Fwd((i % d,), grad=False) for i in range(2 * d)] +
              [_Fwd((i,)) for i in range(d)])
  return _build("alphafold", d, mode, forwards, _chain(0, 3 * d), f_span,
                b_span, split_backward, w_span)


def zbv(num_devices: int, mode: str = "train", f_span: int = 1,
        b_span: int = 3, split_backward: bool = True,
        w_span: int = 1) -> BlockGraph:
  """ZB-V: two chunks per device in a V, with split backward by default.

  One chain of ``2D`` forward stages; stage ``s`` runs on device ``s`` for
  ``s < D`` and on device ``2D-1-s`` for ``s >= D``, so device 0 holds the
  first and the last stage. Backward mirrored, split into ``B`` and ``W``::

    dev0  F0 .  .  .  .  .  .  F7 B7 W7 .  .  .  .  .  B0 W0
    dev1  .  F1 .  .  .  .  F6 .  .  B6 W6 .  .  .  B1 W1 .
    dev2  .  .  F2 .  .  F5 .  .  .  .  B5 W5 .  B2 W2 .  .
    dev3  .  .  .  F3 F4 .  .  .  .  .  .  B4 B3 W4 W3 .  .

  (W blocks wait for nothing but their B; the picture runs them as early as
  possible.)
  """
  d = num_devices
  d = _check_common("zbv", d, mode, {})
  forwards = [_Fwd((s if s < d else 2 * d - 1 - s,)) for s in range(2 * d)]
  return _build("zbv", d, mode, forwards, _chain(0, 2 * d), f_span, b_span,
                split_backward, w_span)


# --- registry ----------------------------------------------------------------

PLACEMENTS: dict[str, Callable[..., BlockGraph]] = {
    "vshape": vshape,
    "interleaved": interleaved,
    "xshape": xshape,
    "mshape": mshape,
    "kshape": kshape,
    "nnshape": nnshape,
    "nnshape_eager": nnshape_eager,
    "mllm": mllm,
    "finetune": finetune,
    "alphafold": alphafold,
    "zbv": zbv,
}


def get(name: str, num_devices: int, **kwargs) -> BlockGraph:
  """Builds the named placement, e.g. ``get("vshape", 4, mode="infer")``.

  Args:
    name: A key of :data:`PLACEMENTS`.
    num_devices: Devices on the pipeline axis.
    **kwargs: Passed to the builder (``mode``, spans, ``chunks``, ...).

  Raises:
    PlacementError: for an unknown name, an unknown keyword or a device count
      the placement does not support.
  """
  try:
    builder = PLACEMENTS[name]
  except (KeyError, TypeError):
    raise PlacementError(
        f"unknown placement {name!r}; valid names are"
        f" {', '.join(sorted(PLACEMENTS))}") from None
  signature = inspect.signature(builder)
  try:
    signature.bind(num_devices, **kwargs)
  except TypeError as err:
    params = [p for p in signature.parameters if p != "num_devices"]
    raise PlacementError(
        f"placement {name!r} does not take these arguments ({err}); its"
        f" keywords are {', '.join(params)}") from None
  return builder(num_devices, **kwargs)
