"""Placements shared by the validator and simulator tests."""

from __future__ import annotations

from hypothesis import strategies as st

from tessel_jax.graph import Block, BlockGraph, Edge, make_graph


def chain_graph(delay: int = 0) -> BlockGraph:
  """2 devices: F0 (d0) -> F1 (d1) -> B1 (d1) -> B0 (d0); F=1, B=2."""
  return make_graph("chain.d2", 2, [
      (0, "F", 1, 1, (0,)), (1, "F", 1, 1, (1,)),
      (2, "B", 2, -1, (1,)), (3, "B", 2, -1, (0,))],
      [Edge(0, 1, delay), Edge(1, 2), Edge(2, 3, delay)])


@st.composite
def random_placements(draw) -> BlockGraph:
  """Random small F/B placements: pairs F_i -> ... -> B_i, random extra edges.

  Every F_i allocates ``m_i`` on its devices and B_i frees it on the same
  devices, so memory returns to zero; every device runs a block.
  """
  nd = draw(st.integers(1, 3))
  pairs = draw(st.integers(nd, 4))
  blocks: list[Block | None] = [None] * (2 * pairs)
  for i in range(pairs):
    devs = set(draw(st.sets(st.integers(0, nd - 1), min_size=1, max_size=nd)))
    if i < nd:
      devs.add(i)
    devs = tuple(sorted(devs))
    mem = draw(st.integers(0, 3))
    blocks[i] = Block(i, "F", draw(st.integers(1, 3)), mem, devs)
    j = 2 * pairs - 1 - i
    blocks[j] = Block(j, "B", draw(st.integers(1, 3)), -mem, devs)
  edges = {(i, 2 * pairs - 1 - i): 0 for i in range(pairs)}
  for _ in range(draw(st.integers(0, 4))):
    a = draw(st.integers(0, 2 * pairs - 2))
    b = draw(st.integers(a + 1, 2 * pairs - 1))
    edges.setdefault((a, b), draw(st.integers(0, 2)))
  return BlockGraph(name="random", num_devices=nd, blocks=tuple(blocks),
                    edges=tuple(Edge(a, b, d) for (a, b), d in edges.items()))
