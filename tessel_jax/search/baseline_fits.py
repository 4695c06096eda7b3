"""Which placements each classic schedule fits (``baselines``), and the
structure it needs from one: single-device forward chains, a stage list.

A ``fits_*`` function (or ``chains`` and friends) returns the structure or
a string saying why the placement does not fit; ``require`` turns that
string into the ValueError naming the baselines that do fit.

No jax, no ortools here.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any

from tessel_jax import placements
from tessel_jax.graph import BlockGraph, PlacementError


@dataclasses.dataclass(frozen=True)
class Chain:
  """A chain of single-device forward stages with their backward blocks.

  Attributes:
    forward: Forward block id per stage, in chain order.
    backward: ``B`` block id per stage.
    weight: ``W`` block id per stage (all None without split backward).
    devices: Device per stage.
  """

  forward: tuple[int, ...]
  backward: tuple[int, ...]
  weight: tuple[int | None, ...]
  devices: tuple[int, ...]

  @property
  def split(self) -> bool:
    return self.weight[0] is not None


def forward_chains(graph: BlockGraph) -> list[Chain] | str:
  """Splits a training graph into forward chains, or says why it cannot.

  Every forward block must run on one device, have a ``B`` (and all or none a
  ``W``), and have at most one forward predecessor and successor.

  Returns:
    The chains ordered by their first forward id, or a reason string.
  """
  try:
    owner = placements.backward_of(graph)
  except PlacementError as err:
    return f"its block names break the F{{i}}/B{{i}}/W{{i}} convention ({err})"
  forwards = [b for b in graph.blocks if b.kind == "F"]
  b_of: dict[int, int] = {}
  w_of: dict[int, int] = {}
  for block_id, fwd in owner.items():
    (b_of if graph.block(block_id).kind == "B" else w_of)[fwd] = block_id
  for f in forwards:
    if len(f.devices) != 1:
      return f"forward block {f.label} runs on {len(f.devices)} devices"
    if f.id not in b_of:
      return (f"forward block {f.label} has no backward (an inference or"
              " frozen block)")
  if w_of and set(w_of) != set(b_of):
    return "only some backward blocks are split into B and W"
  is_forward = {f.id for f in forwards}
  succ: dict[int, list[int]] = {f.id: [] for f in forwards}
  pred: dict[int, list[int]] = {f.id: [] for f in forwards}
  for e in graph.edges:
    if e.src in is_forward and e.dst in is_forward:
      succ[e.src].append(e.dst)
      pred[e.dst].append(e.src)
  for f in forwards:
    if len(succ[f.id]) > 1 or len(pred[f.id]) > 1:
      return f"forward block {f.label} branches or joins"
  chains = []
  for f in forwards:
    if pred[f.id]:
      continue
    ids = [f.id]
    while succ[ids[-1]]:
      ids.append(succ[ids[-1]][0])
    chains.append(Chain(
        forward=tuple(ids), backward=tuple(b_of[i] for i in ids),
        weight=tuple(w_of.get(i) for i in ids),
        devices=tuple(graph.block(i).devices[0] for i in ids)))
  return chains


def _chains(graph: BlockGraph, count: int) -> list[Chain] | str:
  """The graph's ``count`` forward chains, or why it has not that many."""
  chains = forward_chains(graph)
  if isinstance(chains, str) or len(chains) == count:
    return chains
  return (f"it has {len(chains)} forward chains, not"
          f" {'one' if count == 1 else 'two' if count == 2 else count}")


def vshape_chain(graph: BlockGraph) -> Chain | str:
  chains = _chains(graph, 1)
  if isinstance(chains, str):
    return chains
  chain = chains[0]
  if sorted(chain.devices) != list(range(graph.num_devices)):
    return ("its chain does not run exactly one stage on every device"
            f" (stage devices {list(chain.devices)})")
  return chain


def interleaved_chain(graph: BlockGraph) -> tuple[Chain, int] | str:
  chains = _chains(graph, 1)
  if isinstance(chains, str):
    return chains
  chain, d = chains[0], graph.num_devices
  stages = len(chain.forward)
  if stages % d or stages < 2 * d:
    return (f"its chain has {stages} stages; interleaving needs a multiple of"
            f" {d} devices with at least 2 chunks per device")
  if sorted(chain.devices[:d]) != list(range(d)) or any(
      chain.devices[s] != chain.devices[s % d] for s in range(stages)):
    return ("its stages do not repeat the device order of the first chunk"
            " (stage s must run on the device of stage s % D)")
  return chain, stages // d


def xshape_chains(graph: BlockGraph) -> tuple[Chain, Chain] | str:
  chains = _chains(graph, 2)
  if isinstance(chains, str):
    return chains
  down, up = chains
  d = graph.num_devices
  if sorted(down.devices) != list(range(d)):
    return "its first chain does not run one stage on every device"
  if up.devices != down.devices[::-1]:
    return "its second chain does not run the first chain's devices reversed"
  return down, up


def fits_gpipe(graph: BlockGraph) -> BlockGraph:
  return graph


@dataclasses.dataclass(frozen=True)
class StageList:
  """Forward blocks of a training graph as one chain of stages.

  Attributes:
    forward: Forward block id per stage, in chain order.
    owner: Every ``B``/``W`` block id -> its forward block id.
  """

  forward: tuple[int, ...]
  owner: Mapping[int, int]


def stage_list(graph: BlockGraph) -> StageList | str:
  """The graph's forward blocks as a stage list (topological order).

  A chain is the usual stage list; branching placements (``kshape``,
  ``xshape``) list their forward blocks in topological order.
  """
  if graph.is_inference:
    return "it is an inference placement (no backward blocks to interleave)"
  try:
    owner = placements.backward_of(graph)
  except PlacementError as err:
    return f"its block names break the F{{i}}/B{{i}}/W{{i}} convention ({err})"
  order = tuple(b for b in graph.topological_order()
                if graph.block(b).kind == "F")
  return StageList(forward=order, owner=owner)


def fits_1f1b(graph: BlockGraph) -> Chain | StageList | str:
  found = vshape_chain(graph)
  return found if not isinstance(found, str) else stage_list(graph)


def fits_zb_h1(graph: BlockGraph) -> Chain | str:
  found = vshape_chain(graph)
  if isinstance(found, str):
    return found
  if not found.split:
    return ("its backward is not split into B and W; build it with"
            " placements.vshape(D, split_backward=True)")
  return found


def fits_v(graph: BlockGraph) -> Chain | str:
  """A chain of ``2D`` single-device stages in a V (stage ``s`` on device
  ``s``, then ``2D-1-s``) with split backward, as ``placements.zbv``."""
  chains = _chains(graph, 1)
  if isinstance(chains, str):
    return chains
  chain, d = chains[0], graph.num_devices
  want = tuple(s if s < d else 2 * d - 1 - s for s in range(2 * d))
  if chain.devices != want:
    return (f"its stages run on devices {list(chain.devices)}, not the V"
            f" {list(want)} (two stages per device)")
  if not chain.split:
    return ("its backward is not split into B and W; build it with"
            " placements.zbv(D) (split_backward=True)")
  return chain


# --- registry of fits ---------------------------------------------------------

# name -> function returning the structure the baseline needs, or why not.
FITS: dict[str, Callable[[BlockGraph], Any]] = {
    "gpipe": fits_gpipe,
    "1f1b": fits_1f1b,
    "interleaved_1f1b": interleaved_chain,
    "chimera": xshape_chains,
    "zb_h1": fits_zb_h1,
    "dualpipev": fits_v,
    "zbv": fits_v,
}

SUPPORTS: dict[str, str] = {
    "gpipe": "every placement",
    "1f1b": ("training placements (the forward blocks in topological order"
             " are the stage list; shared blocks allowed)"),
    "interleaved_1f1b": ("interleaved placements with >= 2 chunks (stage s on"
                         " device s % D, each with a backward)"),
    "chimera": ("xshape placements (two chains over devices 0..D-1 and"
                " D-1..0, each stage with a backward)"),
    "zb_h1": ("vshape placements with split_backward=True (every stage has B"
              " and W)"),
    "dualpipev": ("zbv placements (2D stages in a V, two per device, split"
                  " backward), N >= 2D"),
    "zbv": "zbv placements (2D stages in a V, two per device, split backward)",
}


def for_placement(graph: BlockGraph) -> list[str]:
  """Names of the baselines that fit ``graph``, in registry order."""
  return [name for name, fits in FITS.items()
          if not isinstance(fits(graph), str)]


def require(name: str, graph: BlockGraph) -> Any:
  """Structure that baseline ``name`` needs; ValueError if it does not fit."""
  found = FITS[name](graph)
  if isinstance(found, str):
    raise ValueError(
        f"baseline {name!r} supports {SUPPORTS[name]}; placement"
        f" {graph.name!r} does not fit because {found}. Baselines that fit"
        f" it: {', '.join(for_placement(graph))}")
  return found
