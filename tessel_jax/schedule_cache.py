"""On-disk cache of searched schedules, so a second process does not search.

A record is keyed by everything the search result depends on: the search
graph (``BlockGraph`` JSON with its spans, memory units and edge delays),
the memory limit in units, the micro-batch count and the search options
(time limit, seed). It lives in the measurement cache's directory
(``$TESSEL_JAX_CACHE`` or ``~/.cache/tessel_jax``; ``cost.cache``, atomic
writes) as ``schedule-<sha256>.json`` and holds the ``Schedule`` (its
repetend, warmup, cooldown and search figures) and the unrolled actions for
that N. A record read back is used only when ``tessel_jax.validate`` finds
no violation for the graph and limit asked for; anything else (unreadable,
other shape, invalid) counts as a miss and the caller searches again.
A ``Schedule`` read back has no ``completer`` or ``alternative`` (the
search's callables): the stored unrolled actions are what the lowering
uses, and unrolling it for another N takes its templates or the compacted
modulo schedule. No jax import here.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from tessel_jax import validate
from tessel_jax.cost.cache import ProfileCache, make_key
from tessel_jax.graph import BlockGraph
from tessel_jax.schedule import Action, Repetend, Schedule, UnrolledSchedule

KIND = "schedule"
FORMAT = 1  # bump when the stored schedule records change meaning


def schedule_key(graph: BlockGraph, memory_limit: int | None,
                 num_microbatches: int, options: Mapping[str, Any]) -> str:
  """The cache key of one search.

  Args:
    graph: The search graph (spans and memory units filled in).
    memory_limit: Per-device limit in memory units (None: unlimited).
    num_microbatches: N of the unrolled schedule.
    options: Search options that change the result (time limit, seed).
  """
  return make_key({"kind": KIND, "schedule_format": FORMAT,
                   "graph": graph.to_dict(), "memory_limit": memory_limit,
                   "num_microbatches": int(num_microbatches),
                   "options": dict(options)})


def _actions(raw: Any) -> tuple[Action, ...]:
  return tuple(Action(int(a["start"]), int(a["block"]), int(a["microbatch"]))
               for a in raw)


def schedule_to_dict(sched: Schedule) -> dict[str, Any]:
  """A ``Schedule`` as JSON-able data (without its graph and callables)."""
  rep = sched.repetend
  return {"repetend": {"period": rep.period, "offsets": list(rep.offsets),
                       "phases": list(rep.phases)},
          "memory_limit": sched.memory_limit,
          "warmup": [a.to_dict() for a in sched.warmup],
          "steady_start": sched.steady_start,
          "cooldown": [a.to_dict() for a in sched.cooldown],
          "status": sched.status,
          "period_lower_bound": sched.period_lower_bound,
          "latency_status": sched.latency_status,
          "latency_lower_bound": sched.latency_lower_bound,
          "search_seconds": sched.search_seconds,
          "period_seconds": sched.period_seconds, "source": sched.source}


def schedule_from_dict(data: Mapping[str, Any], graph: BlockGraph
                       ) -> Schedule:
  """Inverse of :func:`schedule_to_dict` for ``graph``.

  Raises:
    KeyError, TypeError, ValueError: for a malformed record.
  """
  rep = data["repetend"]
  repetend = Repetend(period=int(rep["period"]),
                      offsets=tuple(int(x) for x in rep["offsets"]),
                      phases=tuple(int(x) for x in rep["phases"]))
  if len(repetend.offsets) != len(graph.blocks) or len(
      repetend.phases) != len(graph.blocks):
    raise ValueError("the repetend does not match the graph's blocks")
  return Schedule(
      graph=graph, repetend=repetend, memory_limit=data["memory_limit"],
      warmup=_actions(data["warmup"]), steady_start=int(data["steady_start"]),
      cooldown=_actions(data["cooldown"]), status=str(data["status"]),
      period_lower_bound=int(data["period_lower_bound"]),
      latency_status=str(data["latency_status"]),
      latency_lower_bound=int(data["latency_lower_bound"]),
      search_seconds=float(data["search_seconds"]),
      period_seconds=float(data["period_seconds"]),
      source=str(data["source"]))


class ScheduleCache:
  """Searched schedules on disk (see the module docstring).

  Args:
    directory: The cache directory (None: ``$TESSEL_JAX_CACHE`` or
      ``~/.cache/tessel_jax``).
  """

  def __init__(self, directory: str | None = None):
    self._store = ProfileCache(directory)

  @property
  def directory(self) -> str:
    return self._store.directory

  def load(self, key: str, graph: BlockGraph, num_microbatches: int,
           memory_limit: int | None
           ) -> tuple[Schedule, UnrolledSchedule] | None:
    """The cached ``(schedule, unrolled)`` when valid for these inputs."""

    def decode(record: dict[str, Any]
               ) -> tuple[Schedule, UnrolledSchedule] | None:
      sched = schedule_from_dict(record["schedule"], graph)
      unrolled = UnrolledSchedule.from_dict(record["unrolled"], graph)
      if (unrolled.num_microbatches != num_microbatches or
          sched.memory_limit != memory_limit):
        return None
      if validate.check(unrolled, memory_limit):
        raise ValueError("the stored schedule breaks a rule")
      return sched, unrolled

    return self._store.decoded(KIND, key, decode, "schedule")

  def store(self, key: str, sched: Schedule,
            unrolled: UnrolledSchedule) -> None:
    """Writes the record (best effort, atomically)."""
    self._store.put(KIND, key, {"schedule": schedule_to_dict(sched),
                                "unrolled": unrolled.to_dict()})
