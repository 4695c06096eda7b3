"""The placements and memory limits of Tessel's own evaluation, as BlockGraphs.

Read from Tessel's public repository (github.com/zhiqi-0/Tessel, commit
44f72c3: ``examples/simulator/cases_tessel.py`` defines the placements,
``evaluation/*.sh`` the device counts and memory limits it ran them at)
and written here from their description; no Tessel code is used. Tessel
builds a micro-batch as chains of blocks (each block depends on the one
before it in its chain); forward blocks have span 1, backward blocks span
3 (2 for finetune, 1 for alphafold and the blocks on every device), and
memory +1 / -1 for the blocks of the stages, 0 for the blocks on every
device (inference: every memory 0). These differ from this project's
``tessel_jax.placements`` of the same names in places (there, e.g.,
``nnshape`` has two stage chains and the blocks on every device hold
memory), so they are kept apart here.

The repository holds no makespans: the scripts write logs that are not
committed, and the paper reports figures only as plots.
"""

from __future__ import annotations

from typing import NamedTuple

from tessel_jax.graph import Block, BlockGraph, Edge


class _Spec(NamedTuple):
  """One block before ids: kind, span, memory and devices."""

  kind: str
  span: int
  memory: int
  devices: tuple[int, ...]


def _stages(devices, kind: str, span: int, memory: int) -> list[_Spec]:
  return [_Spec(kind, span, memory, (d,)) for d in devices]


def _every(num_devices: int, kind: str, span: int, memory: int) -> _Spec:
  return _Spec(kind, span, memory, tuple(range(num_devices)))


def _graph(name: str, num_devices: int, chains: list[list[_Spec]],
           train: bool) -> BlockGraph:
  """Blocks of ``chains`` in order (a block object shared by two chains,
  the same ``_Spec`` instance, is one block) with chain edges."""
  ids: dict[int, int] = {}
  blocks: list[Block] = []
  edges: set[tuple[int, int]] = set()
  for chain in chains:
    prev = None
    for spec in chain:
      if id(spec) not in ids:
        ids[id(spec)] = len(blocks)
        blocks.append(Block(len(blocks), spec.kind, spec.span,
                            spec.memory if train else 0, spec.devices))
      if prev is not None:
        edges.add((ids[id(prev)], ids[id(spec)]))
      prev = spec
  mode = "train" if train else "infer"
  return BlockGraph(f"tessel_{name}.{mode}.d{num_devices}", num_devices,
                    tuple(blocks), tuple(Edge(a, b) for a, b in sorted(edges)))


def _vshape(n: int, train: bool) -> list[list[_Spec]]:
  back = _stages(reversed(range(n)), "B", 3, -1) if train else []
  return [_stages(range(n), "F", 1, 1) + back]


def _xshape(n: int, train: bool) -> list[list[_Spec]]:
  down = _stages(range(n), "F", 1, 1)
  up = _stages(reversed(range(n)), "F", 1, 1)
  if train:
    down += _stages(reversed(range(n)), "B", 3, -1)
    up += _stages(range(n), "B", 3, -1)
  return [down, up]


def _with_every(n: int, train: bool, fwd_at: list[int],
                bwd_at: list[int]) -> list[list[_Spec]]:
  """The V-shape with blocks on every device (span 1, memory 0) inserted
  into the forward chain at ``fwd_at`` and the backward at ``bwd_at``
  (positions in insertion order, as Tessel's placements list them)."""
  fwd = _stages(range(n), "F", 1, 1)
  for at in fwd_at:
    fwd.insert(at, _every(n, "F", 1, 0))
  bwd: list[_Spec] = []
  if train:
    bwd = _stages(reversed(range(n)), "B", 3, -1)
    for at in bwd_at:
      bwd.insert(len(bwd) if at < 0 else at, _every(n, "B", 1, 0))
  return [fwd + bwd]


def _kshape(n: int, train: bool) -> list[list[_Spec]]:
  half = n // 2
  shared = [_every(n, "F", 1, 1)]
  if train:
    shared.append(_every(n, "B", 1, -1))
  chains = []
  for devs in (range(half), range(half, n)):
    back = _stages(reversed(devs), "B", 3, -1) if train else []
    chains.append(_stages(devs, "F", 1, 1) + shared + back)
  return chains


def _finetune(n: int, train: bool) -> list[list[_Spec]]:
  back = _stages(reversed(range(n)), "B", 2, -1) if train else []
  return [[_every(n, "F", 1, 0)] + _stages(range(n), "F", 1, 1) + back]


def _alphafold(n: int, train: bool) -> list[list[_Spec]]:
  fwd = (_stages(range(n), "F", 1, 0) + _stages(range(n), "F", 1, 0)
         + _stages(range(n), "F", 1, 1))
  back = _stages(reversed(range(n)), "B", 1, -1) if train else []
  return [fwd + back]


def get(name: str, num_devices: int, train: bool = True) -> BlockGraph:
  """Tessel's placement ``name`` on ``num_devices`` devices.

  Raises:
    ValueError: for a name Tessel does not define here, or a device count
      its definition rejects (nnshape_eager: 4 only; mllm: training only).
  """
  n = num_devices
  builders = {
      "vshape": lambda: _vshape(n, train),
      "xshape": lambda: _xshape(n, train),
      "mshape": lambda: _with_every(n, train, [0], [-1]),
      "nnshape": lambda: _with_every(n, train, [n // 2, 0], [n // 2, -1]),
      "nnshape_eager": lambda: _with_every(n, train, [1, 0], [n - 1, -1]),
      "mllm": lambda: _with_every(n, train, [n, 0], [0, -1]),
      "kshape": lambda: _kshape(n, train),
      "finetune": lambda: _finetune(n, train),
      "alphafold": lambda: _alphafold(n, train),
  }
  if name not in builders:
    raise ValueError(f"tessel_cases.get: unknown placement {name!r}; known:"
                     f" {sorted(builders)}")
  if name == "nnshape_eager" and n != 4:
    raise ValueError("tessel_cases.get: Tessel defines nnshape_eager for 4"
                     f" devices only, got {n}")
  if name == "mllm" and not train:
    raise ValueError("tessel_cases.get: Tessel defines mllm for training"
                     " only")
  return _graph(name, n, builders[name](), train)


#: ``(placement, devices, train, memory limit, script)``: every case of
#: Tessel's evaluation scripts that runs its simulator search
#: (``search_tessel.sh``, ``search_ablation_memory.sh``,
#: ``simu_fast_scale.sh``, ``simu_lazy_scale.sh``), without duplicates.
def cases() -> list[tuple[str, int, bool, int, str]]:
  """The cases of Tessel's evaluation scripts (see the module doc)."""
  out: list[tuple[str, int, bool, int, str]] = []

  def add(name, devices, train, memory, script):
    row = (name, devices, train, memory, script)
    if all(r[:4] != row[:4] for r in out):
      out.append(row)

  for name, train_mem, infer_mem in (
      ("vshape", 4, 4), ("xshape", 4, 4), ("nnshape", 6, 4),
      ("nnshape_eager", 6, None), ("mshape", 6, 4), ("kshape", 6, 4)):
    add(name, 4, True, train_mem, "search_tessel")
    if infer_mem is not None:
      add(name, 4, False, infer_mem, "search_tessel")
  for name in ("nnshape", "mshape"):
    for memory in range(3, 17):
      add(name, 4, True, memory, "search_ablation_memory")
  for name, devices in (("vshape", (4, 5, 6)), ("xshape", (4, 5, 6)),
                        ("nnshape", (4, 5, 6, 7, 8)),
                        ("mshape", (4, 5, 6, 7, 8))):
    for d in devices:
      add(name, d, True, 20, "simu_fast_scale")
  for d in (4, 6, 8):
    add("kshape", d, False, 20, "simu_fast_scale")
  for d in (4, 5, 6, 7, 8):
    add("vshape", d, True, d, "simu_lazy_scale")
  return out
