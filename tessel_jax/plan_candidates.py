"""The candidate plans of ``tj.frontier``: pipe x data widths of the mesh,
micro-batch counts, placements that fit, searched or classic schedules."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

import jax
import numpy as np

from tessel_jax import placements as _placements
from tessel_jax.frontier_result import Candidate
from tessel_jax.graph import PlacementError
from tessel_jax.search import baselines as _baselines


def widths(mesh: Any, pipe_axis: str) -> list[tuple[int, int]]:
  """``(pipe, dp)`` pairs: the mesh's own when it has data axes, else every
  factorisation of the 1-D pipe axis with at least 2 devices per pipeline
  (a single device is no pipeline)."""
  shape = dict(mesh.shape)
  d = int(shape[pipe_axis])
  if len(shape) > 1:
    return [(d, int(np.prod([v for k, v in shape.items() if k != pipe_axis])))]
  return [(p, d // p) for p in range(d, 1, -1) if d % p == 0]


def submesh(mesh: Any, pipe: int, dp: int, pipe_axis: str) -> Any:
  """The mesh of a ``pipe x dp`` plan on ``mesh``'s devices."""
  if dp == 1 and len(mesh.axis_names) == 1:
    return mesh
  if len(mesh.axis_names) > 1:
    return mesh
  devs = np.asarray(mesh.devices).reshape(dp, pipe)
  return jax.sharding.Mesh(devs, ("data", pipe_axis))


def microbatch_counts(rows: int, pipe: int, dp: int,
                      given: Sequence[int] | None) -> list[int]:
  """``N`` candidates: the given ones that fit, else every divisor of the
  batch rows with ``pipe <= N / dp <= 4 pipe`` (enough micro-batches to fill
  the pipeline, few enough to keep micro-batches large)."""
  if given is not None:
    return [n for n in given if rows % n == 0 and n % dp == 0]
  return [n for n in range(dp, rows + 1, dp)
          if rows % n == 0 and pipe <= n // dp <= 4 * pipe]


def frozen(graph: Any) -> bool:
  """Whether a training placement has forward blocks without a backward."""
  owners = set(_placements.backward_of(graph).values())
  return any(b.kind == "F" and b.id not in owners for b in graph.blocks)


def candidates(mesh: Any, pipe_axis: str, rows: int, mode: str,
               names: Sequence[str], microbatches: Sequence[int] | None,
               with_baselines: bool,
               skip: Callable[[str, str], None]) -> list[Candidate]:
  """Every candidate plan on ``mesh`` (placements that do not fit a width
  are reported to ``skip``)."""
  out = []
  for pipe, dp in widths(mesh, pipe_axis):
    counts = microbatch_counts(rows, pipe, dp, microbatches)
    if not counts:
      skip(f"pipe{pipe} dp{dp}", f"no micro-batch count divides the"
           f" {rows} batch rows over {dp} replicas")
      continue
    for name in names:
      try:
        graph = _placements.get(name, pipe, mode=mode)
      except PlacementError as err:
        skip(f"{name} pipe{pipe}", str(err))
        continue
      if mode == "train" and frozen(graph):
        skip(f"{name} pipe{pipe}", "it freezes forward blocks (no backward),"
             " so its gradients would differ from jax.value_and_grad")
        continue
      plans = [None] + (_baselines.for_placement(graph)
                        if with_baselines and mode == "train" else [])
      for n in counts:
        out.extend(Candidate(name, pipe, dp, n, plan) for plan in plans)
  return out


def base_of(c: Candidate) -> Candidate:
  """The searched plan a baseline is priced on (``c`` itself if searched)."""
  if c.plan is None:
    return c
  return dataclasses.replace(c, plan=None, memory_limit=None)


def with_limit(c: Candidate, limit: int | None) -> list[Candidate]:
  """A searched candidate is priced with no limit and, when a limit is
  given, under it too (it may then keep less in flight)."""
  if c.plan is not None or limit is None:
    return [c]
  return [c, dataclasses.replace(c, memory_limit=int(limit))]
