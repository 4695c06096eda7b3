"""Placements given by hand, and what ``tessel_jax.schedule`` derives from a
placement graph before cutting the traced function (forward counts,
inference graphs, forward reachability). No jax here.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from tessel_jax import checks as _checks
from tessel_jax import placements as _placements
from tessel_jax.graph import Block, BlockGraph, Edge, PlacementError

#: Block spans of a placement with uniform costs (``cost="uniform"``).
SPANS = {"F": 1, "B": 2, "W": 1}


def _device_lists(devices: Any) -> tuple[tuple[int, ...], ...]:
  """Per block, its devices as ints (a bare int is one device)."""
  where = "Placement"
  if isinstance(devices, (str, bytes)) or not isinstance(devices, Sequence):
    raise PlacementError(f"{where}: devices must be a list with one device"
                         f" (or a list of devices) per block, got"
                         f" {type(devices).__name__}")
  out = []
  for i, d in enumerate(devices):
    field = f"block {i} device"
    if _checks.is_integer(d):
      out.append((_checks.integer(d, field, low=0,
                                  high=_checks.MAX_DEVICES - 1, where=where,
                                  error=PlacementError),))
      continue
    if isinstance(d, (str, bytes)) or not isinstance(d, (Sequence, set,
                                                         frozenset)):
      raise PlacementError(f"{where}: block {i} devices must be an int or a"
                           f" list of ints, got {d!r}")
    if not d:
      raise PlacementError(f"{where}: block {i} has no devices; give it at"
                           " least one")
    out.append(tuple(_checks.integer(x, field, low=0,
                                     high=_checks.MAX_DEVICES - 1,
                                     where=where, error=PlacementError)
                     for x in d))
  if not out:
    raise PlacementError(f"{where}: has no blocks; give one entry per block")
  return tuple(out)


@dataclasses.dataclass(frozen=True)
class Placement:
  """A placement given by hand: forward block index -> devices.

  The graph's edges follow the traced data flow; every block has a backward
  on the same devices unless ``no_grad`` lists it.

  Attributes:
    devices: Per forward block, the devices (pipe-axis indices) it runs on.
    no_grad: Forward blocks without a backward (frozen).
    name: Name used in the graph.
  """

  devices: tuple[tuple[int, ...], ...]
  no_grad: frozenset[int] = frozenset()
  name: str = "custom"

  def __init__(self, devices: Sequence[int | Sequence[int]] | Mapping[int, Any],
               no_grad: Sequence[int] = (), name: str = "custom"):
    if isinstance(devices, Mapping):
      keys = sorted(devices)
      if keys != list(range(len(keys))):
        raise PlacementError(
            f"Placement maps blocks {keys}; give every block 0..{len(keys)-1}"
            " its devices")
      devices = [devices[k] for k in keys]
    object.__setattr__(self, "devices", _device_lists(devices))
    no_grad = _checks.sequence(list(no_grad) if isinstance(
        no_grad, (set, frozenset)) else no_grad, "no_grad", where="Placement",
                               error=PlacementError)
    object.__setattr__(self, "no_grad", frozenset(
        _checks.integer(i, "no_grad entry", low=0, where="Placement",
                        error=PlacementError) for i in no_grad))
    object.__setattr__(self, "name", _checks.string(
        name, "name", where="Placement", error=PlacementError))

  @property
  def num_blocks(self) -> int:
    return len(self.devices)

  def to_graph(self, num_devices: int, edges: Sequence[tuple[int, int]],
               mode: str = "train") -> BlockGraph:
    """The BlockGraph of this placement for forward data edges ``edges``."""
    n = len(self.devices)
    blocks = [Block(i, "F", SPANS["F"], 0, self.devices[i], f"F{i}")
              for i in range(n)]
    all_edges = [Edge(s, d) for s, d in edges]
    if mode == "train":
      grads = [i for i in reversed(range(n)) if i not in self.no_grad]
      bid = {i: n + k for k, i in enumerate(grads)}
      for i in grads:
        blocks.append(Block(bid[i], "B", SPANS["B"], 0, self.devices[i],
                            f"B{i}"))
      for s, d in edges:
        if s in bid and d in bid:
          all_edges.append(Edge(bid[d], bid[s]))
      for i in grads:
        if not any(s == i and d in bid for s, d in edges):
          all_edges.append(Edge(i, bid[i]))
    return BlockGraph(name=f"{self.name}.{mode}.d{num_devices}",
                      num_devices=num_devices, blocks=tuple(blocks),
                      edges=tuple(all_edges))



def forward_count(graph: BlockGraph) -> int:
  """Number of forward blocks of ``graph``."""
  return sum(1 for b in graph.blocks if b.kind == "F")


def fitting_placements(count: int, num_devices: int) -> list[str]:
  """Named placements with ``count`` forward blocks on ``num_devices``."""
  out = []
  for name in _placements.PLACEMENTS:
    try:
      g = _placements.get(name, num_devices)
    except Exception:  # pylint: disable=broad-except
      continue
    if forward_count(g) == count:
      out.append(f"placements.{name}({num_devices})")
  if count % num_devices == 0 and count // num_devices >= 2:
    out.append(f"placements.interleaved({num_devices},"
               f" chunks={count // num_devices})")
  return out


def forward_only(graph: BlockGraph) -> BlockGraph:
  """The inference graph of a training graph: forward blocks, memory 0."""
  keep = {b.id for b in graph.blocks if b.kind == "F"}
  blocks = tuple(dataclasses.replace(b, memory=0) for b in graph.blocks
                 if b.id in keep)
  edges = tuple(e for e in graph.edges if e.src in keep and e.dst in keep)
  name = graph.name.replace(".train.", ".infer.")
  return BlockGraph(name=name, num_devices=graph.num_devices, blocks=blocks,
                    edges=edges)


def forward_reach(graph: BlockGraph, forward_of: Mapping[int, int]
                  ) -> Callable[[int, int], bool]:
  """``reach(i, j)``: forward block ``j`` depends on ``i`` (by forward
  index, ``forward_of`` mapping block ids to it)."""
  fids = {forward_of[b.id]: b.id for b in graph.blocks if b.kind == "F"}
  succ: dict[int, list[int]] = {}
  for e in graph.edges:
    if graph.block(e.src).kind == "F" and graph.block(e.dst).kind == "F":
      succ.setdefault(forward_of[e.src], []).append(forward_of[e.dst])
  closure: dict[int, set[int]] = {}
  for i in fids:
    seen, stack = set(), list(succ.get(i, []))
    while stack:
      j = stack.pop()
      if j not in seen:
        seen.add(j)
        stack.extend(succ.get(j, []))
    closure[i] = seen
  return lambda i, j: j in closure.get(i, ())
