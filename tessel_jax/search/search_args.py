"""``search_repetend``'s arguments checked before any solver call, and a
``start`` repetend read into the period search's terms."""

from __future__ import annotations

from typing import Any

from tessel_jax import checks, validate
from tessel_jax.graph import BlockGraph, check_searchable
from tessel_jax.schedule import (Repetend, Schedule, UnrolledSchedule,
                                 modulo_actions)
from tessel_jax.search.modulo_solution import ModuloSolution, steady_peak


def check_search_args(graph: BlockGraph, memory_limit: Any,
                      allow_wrap: Any, time_limit_s: Any, seed: Any,
                      num_workers: Any, complete: Any, list_alternative: Any
                      ) -> tuple[int | None, float]:
  """Checks ``search_repetend``'s arguments before any solver call.

  Returns:
    ``(memory_limit, time_limit_s)`` as an int (or None) and a float.

  Raises:
    checks.InputError: naming the argument, its value and the fix.
  """
  where = "search_repetend"
  if not isinstance(graph, BlockGraph):
    raise checks.InputError(
        f"{where}: graph must be a tessel_jax BlockGraph (e.g."
        f" tj.placements.get('vshape', 4)), got {type(graph).__name__}")
  check_searchable(graph)
  limit = checks.memory_limit(memory_limit, where=where)
  seconds = checks.time_limit(time_limit_s, where=where)
  checks.integer(seed, "seed", low=0, high=2**31 - 1, where=where)
  checks.integer(num_workers, "num_workers", low=1, high=64, where=where)
  for name, value in (("allow_wrap", allow_wrap), ("complete", complete),
                      ("list_alternative", list_alternative)):
    checks.boolean(value, name, where=where)
  return limit, seconds


def given_start(graph: BlockGraph, start: Any, memory_limit: int | None,
                allow_wrap: bool) -> tuple[int, ModuloSolution] | None:
  """``start`` as ``(period, solution)`` after checking it.

  Raises:
    checks.InputError: if ``start`` is not a repetend of ``graph`` that
      fits ``memory_limit`` (and, with ``allow_wrap`` False, wraps no block).
  """
  if start is None:
    return None
  where = "search_repetend(start=...)"
  if not isinstance(start, Repetend):
    raise checks.InputError(f"{where}: expected a tessel_jax Repetend (e.g."
                            " from smallest_memory_repetend), got"
                            f" {type(start).__name__}")
  n, period = graph.num_blocks, start.period
  if (len(start.offsets) != n or len(start.phases) != n or period < 1
      or any(not 0 <= r < period for r in start.phases)
      or min(start.offsets) < 0):
    raise checks.InputError(f"{where}: not a repetend of {graph.name!r}"
                            f" ({n} blocks, phases in [0, period)); pass one"
                            " searched for this placement")
  spans = [b.span for b in graph.blocks]
  if not allow_wrap and any(r + w > period
                            for r, w in zip(start.phases, spans)):
    raise checks.InputError(f"{where}: a block wraps the period end; pass"
                            " allow_wrap=True or a repetend without wrap")
  num = 2 * start.max_offset + 2
  problems = validate.check(UnrolledSchedule(
      graph=graph, num_microbatches=num,
      actions=tuple(sorted(modulo_actions(Schedule(graph, start), num)))),
      memory_limit=None)
  if problems:
    raise checks.InputError(f"{where}: the repetend breaks the rules of"
                            f" {graph.name!r}: {problems[0].message}")
  peak = steady_peak(graph, period, start.phases, start.offsets)
  if memory_limit is not None and peak > memory_limit:
    raise checks.InputError(f"{where}: its steady peak {peak} exceeds the"
                            f" memory limit {memory_limit}; raise the limit"
                            " or pass a repetend that fits")
  return period, ModuloSolution("FEASIBLE", offsets=start.offsets,
                                phases=start.phases)
