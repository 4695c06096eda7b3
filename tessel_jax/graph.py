"""BlockGraph: the placement IR shared by search, validation and lowering.

A placement is a DAG of *blocks* for ONE micro-batch. Each block has a kind
(``F`` forward, ``B`` backward, ``W`` weight-gradient), an integer ``span``
(time steps), a ``memory`` delta (added to every device of the block when it
starts, may be negative) and the tuple of devices it occupies. Edges are
dependencies inside one micro-batch; an edge may carry a ``delay`` (time steps
of communication between the end of its source and the start of its
destination).

This module imports neither jax nor ortools (DESIGN.md §2).
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from tessel_jax import checks

BLOCK_KINDS = ("F", "B", "W")


class PlacementError(checks.InputError):
  """A placement (BlockGraph) is malformed; the message says how to fix it."""


@dataclasses.dataclass(frozen=True)
class Block:
  """One block of a micro-batch.

  Attributes:
    id: Unique integer id of the block inside its graph.
    kind: ``"F"``, ``"B"`` or ``"W"``.
    span: Number of integer time steps the block occupies its devices (> 0).
    memory: Memory delta added to each of its devices when the block starts.
    devices: Devices (indices on the pipeline axis) the block occupies.
    name: Optional human-readable label (for pictures and errors).
  """

  id: int
  kind: str
  span: int
  memory: int
  devices: tuple[int, ...]
  name: str = ""

  @property
  def label(self) -> str:
    """Short label used in grids and plots, e.g. ``F3``."""
    return self.name or f"{self.kind}{self.id}"


@dataclasses.dataclass(frozen=True)
class Edge:
  """Dependency ``src -> dst`` inside one micro-batch.

  Attributes:
    src: Id of the producing block.
    dst: Id of the consuming block.
    delay: Time steps between the end of ``src`` and the earliest start of
      ``dst`` (communication time); 0 for no delay.
  """

  src: int
  dst: int
  delay: int = 0


@dataclasses.dataclass(frozen=True)
class BlockGraph:
  """A validated placement: blocks, dependency edges and the device count.

  Construction checks every invariant and raises ``PlacementError`` with a
  fix for the first problem found.

  Attributes:
    name: Placement name, e.g. ``"vshape.train.d4"``.
    num_devices: Number of devices on the pipeline axis.
    blocks: Blocks in a canonical order (the order given).
    edges: Dependency edges.
  """

  name: str
  num_devices: int
  blocks: tuple[Block, ...]
  edges: tuple[Edge, ...] = ()
  _positions: Mapping[int, int] = dataclasses.field(
      init=False, repr=False, compare=False, hash=False, default=None)
  _edges_out: Mapping[int, tuple[Edge, ...]] = dataclasses.field(
      init=False, repr=False, compare=False, hash=False, default=None)
  _edges_in: Mapping[int, tuple[Edge, ...]] = dataclasses.field(
      init=False, repr=False, compare=False, hash=False, default=None)

  def __post_init__(self) -> None:
    where = _where(self.name)
    checks.string(self.name, "name", where="placement",
                  error=PlacementError)
    object.__setattr__(self, "num_devices", checks.integer(
        self.num_devices, "num_devices", low=1, high=checks.MAX_DEVICES,
        where=where, error=PlacementError,
        fix="the search models at most that many devices per pipeline"))
    object.__setattr__(self, "blocks", _typed_blocks(where, self.blocks))
    object.__setattr__(self, "edges", _typed_edges(where, self.edges))
    object.__setattr__(self, "_positions",
                       {b.id: i for i, b in enumerate(self.blocks)})
    edges_out: dict[int, list[Edge]] = {}
    edges_in: dict[int, list[Edge]] = {}
    for e in self.edges:
      edges_out.setdefault(e.src, []).append(e)
      edges_in.setdefault(e.dst, []).append(e)
    object.__setattr__(self, "_edges_out",
                       {k: tuple(v) for k, v in edges_out.items()})
    object.__setattr__(self, "_edges_in",
                       {k: tuple(v) for k, v in edges_in.items()})
    _check_graph(self)

  # --- lookups -------------------------------------------------------------

  @property
  def num_blocks(self) -> int:
    return len(self.blocks)

  @property
  def ids(self) -> tuple[int, ...]:
    return tuple(b.id for b in self.blocks)

  def block(self, block_id: int) -> Block:
    """Returns the block with id ``block_id``."""
    return self.blocks[self.index(block_id)]

  def index(self, block_id: int) -> int:
    """Position of block ``block_id`` in ``self.blocks``."""
    try:
      return self._positions[block_id]
    except KeyError:
      raise PlacementError(
          f"placement {self.name!r} has no block with id {block_id}; its ids"
          f" are {sorted(self.ids)}") from None

  def predecessors(self, block_id: int) -> tuple[Edge, ...]:
    """Edges entering ``block_id`` (indexed: no scan of all edges)."""
    return self._edges_in.get(block_id, ())

  def successors(self, block_id: int) -> tuple[Edge, ...]:
    """Edges leaving ``block_id`` (indexed: no scan of all edges)."""
    return self._edges_out.get(block_id, ())

  def blocks_on(self, device: int) -> tuple[Block, ...]:
    """Blocks that occupy ``device``, in canonical order."""
    return tuple(b for b in self.blocks if device in b.devices)

  def device_load(self, device: int) -> int:
    """Busy steps of ``device`` per micro-batch (sum of its blocks' spans)."""
    return sum(b.span for b in self.blocks_on(device))

  def topological_order(self) -> tuple[int, ...]:
    """Block ids in a deterministic topological order (ties by position)."""
    return _topological_order(self)

  @property
  def is_inference(self) -> bool:
    """True when every block is a forward block with zero memory."""
    return all(b.kind == "F" and b.memory == 0 for b in self.blocks)

  def with_delays(self, delay: int | Mapping[tuple[int, int], int]) -> "BlockGraph":
    """Returns a copy whose edges between different device sets get a delay.

    Args:
      delay: One delay for every edge whose endpoints run on different device
        sets, or a mapping ``(src, dst) -> delay`` for chosen edges.
    """
    edges = []
    for e in self.edges:
      if isinstance(delay, Mapping):
        d = delay.get((e.src, e.dst), e.delay)
      elif self.block(e.src).devices != self.block(e.dst).devices:
        d = delay
      else:
        d = e.delay
      edges.append(Edge(e.src, e.dst, d))
    return dataclasses.replace(self, edges=tuple(edges))

  # --- JSON (DESIGN.md §4) -------------------------------------------------

  def to_dict(self) -> dict[str, Any]:
    """The placement as the DESIGN §4 JSON object."""
    out: dict[str, Any] = {
        "name": self.name,
        "num_devices": self.num_devices,
        "blocks": [_block_to_dict(b) for b in self.blocks],
        "edges": [[e.src, e.dst] for e in self.edges],
    }
    if any(e.delay for e in self.edges):
      out["edge_delays"] = [e.delay for e in self.edges]
    return out

  def to_json(self, indent: int | None = None) -> str:
    return json.dumps(self.to_dict(), indent=indent)

  @classmethod
  def from_dict(cls, data: Mapping[str, Any]) -> "BlockGraph":
    """Builds a graph from the DESIGN §4 JSON object (validated).

    Raises:
      PlacementError: naming the field for a missing key, a wrong type (a
        string, boolean, NaN or fractional number where an integer belongs)
        or a value out of range.
    """
    where = "placement JSON"
    checks.mapping(data, "the placement", where=where, error=PlacementError)
    for key in ("name", "num_devices", "blocks"):
      if key not in data:
        raise PlacementError(
            f"placement JSON has no {key!r} field; expected the keys name,"
            " num_devices, blocks and edges (DESIGN.md §4)")
    name = checks.string(data["name"], "name", where=where,
                         error=PlacementError)
    where = _where(name)
    raw_blocks = checks.sequence(data["blocks"], "blocks", where=where,
                                 error=PlacementError)
    blocks = [_block_from_dict(where, i, raw)
              for i, raw in enumerate(raw_blocks)]
    raw_edges = checks.sequence(data.get("edges", []), "edges", where=where,
                                error=PlacementError)
    delays = checks.sequence(data.get("edge_delays", [0] * len(raw_edges)),
                             "edge_delays", where=where, error=PlacementError)
    if len(delays) != len(raw_edges):
      raise PlacementError(
          f"placement JSON has {len(raw_edges)} edges but"
          f" {len(delays)} edge_delays; give one delay per edge")
    edges = []
    for i, (raw, delay) in enumerate(zip(raw_edges, delays)):
      raw = checks.sequence(raw, f"edges[{i}]", where=where,
                            error=PlacementError)
      if len(raw) not in (2, 3):
        raise PlacementError(
            f"{where}: edges[{i}] is {raw!r}; each edge must be [src, dst] or"
            " [src, dst, delay]")
      edges.append(Edge(raw[0], raw[1], raw[2] if len(raw) == 3 else delay))
    return check_searchable(cls(name=name, num_devices=data["num_devices"],
                                blocks=tuple(blocks), edges=tuple(edges)))

  @classmethod
  def from_json(cls, text: str) -> "BlockGraph":
    """Parses DESIGN §4 placement JSON text (see :meth:`from_dict`).

    Raises:
      PlacementError: for text that is not JSON (NaN and Infinity included)
        or not a valid placement.
    """
    if isinstance(text, (bytes, bytearray)):
      try:
        text = text.decode("utf-8")
      except UnicodeDecodeError as err:
        raise PlacementError(f"placement JSON is not UTF-8 text ({err});"
                             " save the file as UTF-8") from None
    checks.string(text, "placement JSON text", error=PlacementError)
    try:
      data = json.loads(text, parse_constant=_refuse_constant)
    except json.JSONDecodeError as err:
      raise PlacementError(f"placement JSON does not parse: {err}; fix the"
                           " file (DESIGN.md §4)") from None
    return cls.from_dict(data)


def _refuse_constant(name: str) -> Any:
  raise PlacementError(f"placement JSON holds {name}; spans, memory and ids"
                       " must be finite integers")


def _where(name: Any) -> str:
  return f"placement {name!r}"


def _block_from_dict(where: str, index: int, raw: Any) -> "Block":
  raw = checks.mapping(raw, f"blocks[{index}]", where=where,
                       error=PlacementError)
  missing = {"id", "kind", "span", "memory", "devices"} - set(raw)
  if missing:
    raise PlacementError(
        f"{where}: blocks[{index}] {raw!r} lacks {sorted(missing)}; every"
        " block needs id, kind, span, memory and devices")
  devices = checks.sequence(raw["devices"], f"blocks[{index}].devices",
                            where=where, error=PlacementError)
  return Block(id=raw["id"], kind=raw["kind"], span=raw["span"],
               memory=raw["memory"], devices=tuple(devices),
               name=raw.get("name", ""))


def _block_to_dict(block: Block) -> dict[str, Any]:
  out: dict[str, Any] = {"id": block.id, "kind": block.kind,
                         "span": block.span, "memory": block.memory,
                         "devices": list(block.devices)}
  if block.name:
    out["name"] = block.name
  return out


# --- invariants --------------------------------------------------------------

def _typed_blocks(where: str, blocks: Any) -> tuple[Block, ...]:
  """Blocks with every field type- and range-checked (ints made ints)."""
  if isinstance(blocks, (str, bytes)) or not isinstance(blocks, Iterable):
    raise PlacementError(f"{where}: blocks must be a list of Block, got"
                         f" {type(blocks).__name__}")
  out = []
  for i, b in enumerate(blocks):
    if not isinstance(b, Block):
      raise PlacementError(f"{where}: blocks[{i}] is a"
                           f" {type(b).__name__}; give tessel_jax.Block"
                           " objects (or use make_graph with tuples)")
    field = f"blocks[{i}]"
    bid = checks.integer(b.id, f"{field}.id", low=0, where=where,
                         error=PlacementError)
    field = f"block {bid}"
    if not isinstance(b.kind, str) or b.kind not in BLOCK_KINDS:
      raise PlacementError(f"{where}: {field} has kind {b.kind!r}; use one of"
                           f" {', '.join(BLOCK_KINDS)}")
    span = checks.integer(
        b.span, f"{field} span", low=1, high=checks.MAX_SPAN, where=where,
        error=PlacementError,
        fix="spans are integer time steps (quantise measured times up)")
    memory = checks.integer(
        b.memory, f"{field} memory", low=-checks.MAX_GRAPH_MEMORY,
        high=checks.MAX_GRAPH_MEMORY, where=where, error=PlacementError,
        fix="memory is an integer delta in the placement's units")
    if isinstance(b.devices, (str, bytes)) or not isinstance(
        b.devices, Iterable):
      raise PlacementError(f"{where}: {field} devices must be a list of"
                           f" device indices, got {b.devices!r}")
    devices = tuple(checks.integer(d, f"{field} device", low=0,
                                   where=where, error=PlacementError)
                    for d in b.devices)
    name = checks.string(b.name, f"{field} name", where=where,
                         error=PlacementError)
    out.append(Block(bid, b.kind, span, memory, devices, name))
  return tuple(out)


def _typed_edges(where: str, edges: Any) -> tuple[Edge, ...]:
  """Edges with integer ends and delays (tuples made Edges)."""
  if isinstance(edges, (str, bytes)) or not isinstance(edges, Iterable):
    raise PlacementError(f"{where}: edges must be a list of (src, dst),"
                         f" got {type(edges).__name__}")
  out = []
  for i, e in enumerate(edges):
    if not isinstance(e, Edge):
      if not isinstance(e, (list, tuple)) or len(e) not in (2, 3):
        raise PlacementError(f"{where}: edges[{i}] is {e!r}; each edge must"
                             " be (src, dst) or (src, dst, delay)")
      e = Edge(*e)
    src = checks.integer(e.src, f"edges[{i}] src", where=where,
                         error=PlacementError)
    dst = checks.integer(e.dst, f"edges[{i}] dst", where=where,
                         error=PlacementError)
    delay = checks.integer(e.delay, f"edge {src}->{dst} delay", low=0,
                           high=checks.MAX_SPAN, where=where,
                           error=PlacementError,
                           fix="delays are integer time steps")
    out.append(Edge(src, dst, delay))
  return tuple(out)


def check_searchable(graph: "BlockGraph") -> "BlockGraph":
  """Refuses a placement larger than the search can model; returns it.

  Bounds (``tessel_jax.checks``): at most ``MAX_BLOCKS`` blocks, spans and
  delays adding up to at most ``MAX_TOTAL_SPAN`` steps, block memory within
  ``+-MAX_MEMORY`` units. Called by every user entry point (JSON,
  ``make_graph``, ``search_repetend``) before any solver call.

  Raises:
    PlacementError: naming the size and the bound.
  """
  where = _where(graph.name)
  for b in graph.blocks:
    if abs(b.memory) > checks.MAX_MEMORY:
      raise PlacementError(
          f"{where}: block {b.id} memory is {b.memory}; the search models"
          f" |memory| <= {checks.MAX_MEMORY} units per block; use a coarser"
          " memory unit")
  if len(graph.blocks) > checks.MAX_BLOCKS:
    raise PlacementError(f"{where}: has {len(graph.blocks)} blocks; the"
                         f" search models at most {checks.MAX_BLOCKS}")
  total = (sum(b.span for b in graph.blocks)
           + sum(e.delay for e in graph.edges))
  if total > checks.MAX_TOTAL_SPAN:
    raise PlacementError(
        f"{where}: spans and delays add up to {total} steps; the search"
        f" models at most {checks.MAX_TOTAL_SPAN} (its period tables are"
        " that long); use a coarser time unit")
  return graph


def _fail(graph: BlockGraph, problem: str) -> None:
  raise PlacementError(f"placement {graph.name!r}: {problem}")


def _check_graph(graph: BlockGraph) -> None:
  """Raises PlacementError for the first broken invariant of ``graph``."""
  if graph.num_devices <= 0:
    _fail(graph, f"num_devices is {graph.num_devices}; it must be >= 1")
  if not graph.blocks:
    _fail(graph, "has no blocks; give at least one block per device")
  seen: set[int] = set()
  for b in graph.blocks:
    if b.id in seen:
      _fail(graph, f"block id {b.id} is used twice; give every block its own"
            " id")
    seen.add(b.id)
    if b.kind not in BLOCK_KINDS:
      _fail(graph, f"block {b.id} has kind {b.kind!r}; use one of"
            f" {', '.join(BLOCK_KINDS)}")
    if b.span <= 0:
      _fail(graph, f"block {b.id} has span {b.span}; spans must be >= 1"
            " integer steps (quantise measured times up)")
    if not b.devices:
      _fail(graph, f"block {b.id} has no devices; give it at least one")
    if len(set(b.devices)) != len(b.devices):
      _fail(graph, f"block {b.id} lists a device twice: {list(b.devices)}")
    for d in b.devices:
      if not 0 <= d < graph.num_devices:
        _fail(graph, f"block {b.id} uses device {d}, but devices are"
              f" 0..{graph.num_devices - 1}; raise num_devices or fix the"
              " block's devices")
  for e in graph.edges:
    for end in (e.src, e.dst):
      if end not in seen:
        _fail(graph, f"edge {e.src}->{e.dst} names block {end}, which does"
              f" not exist; block ids are {sorted(seen)}")
    if e.src == e.dst:
      _fail(graph, f"edge {e.src}->{e.dst} is a self loop; remove it")
    if e.delay < 0:
      _fail(graph, f"edge {e.src}->{e.dst} has delay {e.delay}; delays must"
            " be >= 0")
  pairs = [(e.src, e.dst) for e in graph.edges]
  if len(set(pairs)) != len(pairs):
    dup = next(p for p in pairs if pairs.count(p) > 1)
    _fail(graph, f"edge {dup[0]}->{dup[1]} is given twice; keep one")
  _topological_order(graph)  # raises on a cycle
  for d in range(graph.num_devices):
    on_d = [b for b in graph.blocks if d in b.devices]
    if not on_d:
      _fail(graph, f"device {d} runs no block; lower num_devices or place a"
            " block on it")
    total = sum(b.memory for b in on_d)
    if total != 0:
      _fail(graph, f"memory on device {d} never returns to zero (blocks"
            f" {[b.id for b in on_d]} add up to {total:+d} per micro-batch);"
            " every allocation needs a matching release, e.g. B.memory ="
            " -F.memory")


def _topological_order(graph: BlockGraph) -> tuple[int, ...]:
  position = {b.id: i for i, b in enumerate(graph.blocks)}
  indegree = {b.id: 0 for b in graph.blocks}
  succ: dict[int, list[int]] = {b.id: [] for b in graph.blocks}
  for e in graph.edges:
    indegree[e.dst] += 1
    succ[e.src].append(e.dst)
  ready = sorted((i for i, n in indegree.items() if n == 0),
                 key=position.__getitem__)
  order: list[int] = []
  while ready:
    node = ready.pop(0)
    order.append(node)
    for nxt in succ[node]:
      indegree[nxt] -= 1
      if indegree[nxt] == 0:
        ready.append(nxt)
    ready.sort(key=position.__getitem__)
  if len(order) != len(graph.blocks):
    cycle = sorted(i for i, n in indegree.items() if n > 0)
    _fail(graph, f"edges form a cycle through blocks {cycle}; a micro-batch"
          " must be a DAG")
  return tuple(order)


def make_graph(name: str, num_devices: int,
               blocks: Iterable[Block | Sequence[Any]],
               edges: Iterable[Edge | Sequence[int]] = ()) -> BlockGraph:
  """Convenience constructor accepting tuples for blocks and edges."""
  where = _where(name)
  typed = []
  if isinstance(blocks, (str, bytes)) or not isinstance(blocks, Iterable):
    raise PlacementError(f"{where}: blocks must be a list of blocks, got"
                         f" {type(blocks).__name__}")
  for i, b in enumerate(blocks):
    if not isinstance(b, Block):
      if not isinstance(b, (list, tuple)) or not 5 <= len(b) <= 6:
        raise PlacementError(
            f"{where}: blocks[{i}] is {b!r}; give (id, kind, span, memory,"
            " devices[, name]) or a tessel_jax.Block")
      b = Block(*b)
    typed.append(b)
  blocks = tuple(typed)
  return check_searchable(BlockGraph(name=name, num_devices=num_devices,
                                    blocks=blocks, edges=edges))
