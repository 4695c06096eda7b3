"""A two-device F/B chain shared by the validator and simulator tests."""

from __future__ import annotations

from tessel_jax.graph import BlockGraph, Edge, make_graph


def chain_graph(delay: int = 0) -> BlockGraph:
  """2 devices: F0 (d0) -> F1 (d1) -> B1 (d1) -> B0 (d0); F=1, B=2."""
  return make_graph("chain.d2", 2, [
      (0, "F", 1, 1, (0,)), (1, "F", 1, 1, (1,)),
      (2, "B", 2, -1, (1,)), (3, "B", 2, -1, (0,))],
      [Edge(0, 1, delay), Edge(1, 2), Edge(2, 3, delay)])
