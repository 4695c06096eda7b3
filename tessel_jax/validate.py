"""Independent checker of an unrolled schedule (DESIGN.md §3).

This module is the referee between the search, the baselines and the
lowering: it shares no code with them. It reads only the raw data of a
schedule (``schedule.graph.blocks`` / ``schedule.graph.edges`` fields,
``schedule.actions``, ``schedule.num_microbatches`` and
``schedule.memory_limit``) and recomputes every timing and memory figure
itself.

Rules checked, each with its violation kind:

* ``"extra"``: an action names an unknown block, repeats a (block,
  micro-batch) pair, or names a micro-batch outside ``0 .. N-1``.
* ``"missing"``: a (block, micro-batch) pair has no action.
* ``"negative_start"``: an action starts before step 0.
* ``"dependency"``: for an edge ``src -> dst`` (same micro-batch),
  ``start(dst) >= start(src) + span(src) + delay`` fails.
* ``"order"``: block ``b`` of micro-batch ``m + 1`` does not start strictly
  after block ``b`` of micro-batch ``m``.
* ``"overlap"``: two actions occupy one device at the same step (a block
  occupies all its devices during ``[start, start + span)``).
* ``"memory"``: the running memory sum of a device (0 at first; each block
  adds its ``memory`` to each of its devices when it starts; all events of a
  step counted together) exceeds the limit after some step. It is reported
  at every step that raises the level to above the limit (a step that
  leaves it above the limit without raising it adds no new violation).

Actions reported as ``"extra"`` are left out of every other check (for a
repeated pair the earliest action is kept), so each planted mistake is
reported once under its own kind. Every other violation is reported, not only
the first one.

No jax, no ortools here.
"""

from __future__ import annotations

import dataclasses
import enum
from collections import defaultdict
from typing import Any


class _Default(enum.Enum):
  FROM_SCHEDULE = enum.auto()


#: Default of ``memory_limit``: use ``schedule.memory_limit``.
FROM_SCHEDULE = _Default.FROM_SCHEDULE

#: Violation kinds, in the order ``check`` reports them.
KINDS = ("extra", "missing", "negative_start", "dependency", "order",
         "overlap", "memory")

#: How many violations ``assert_valid`` spells out.
MAX_LISTED = 20


@dataclasses.dataclass(frozen=True)
class Violation:
  """One broken rule.

  Attributes:
    kind: One of ``KINDS``.
    message: What is wrong, in words.
    step: Step at which it happens (the start of the offending action, or
      the step at which memory is too high); None where no step applies
      (a missing action).
    device: Device on which it happens. For rules about a whole block
      (dependency, order, negative start, extra) this is the block's first
      device; None where no device applies (a missing action, an unknown
      block).
    block: Id of the offending block, or None.
    microbatch: Micro-batch of the offending action, or None.
  """

  kind: str
  message: str
  step: int | None = None
  device: int | None = None
  block: int | None = None
  microbatch: int | None = None

  def __str__(self) -> str:
    return f"[{self.kind}] {self.message}"


class ScheduleValidationError(ValueError):
  """A schedule breaks the DESIGN §3 rules; ``violations`` lists them all."""

  def __init__(self, violations: list[Violation], name: str = "") -> None:
    self.violations = list(violations)
    shown = "\n".join(f"  {v}" for v in self.violations[:MAX_LISTED])
    more = len(self.violations) - MAX_LISTED
    tail = f"\n  ... and {more} more" if more > 0 else ""
    where = f" for placement {name!r}" if name else ""
    super().__init__(
        f"schedule{where} has {len(self.violations)} violation(s):\n"
        f"{shown}{tail}")


@dataclasses.dataclass(frozen=True)
class _BlockInfo:
  position: int
  span: int
  memory: int
  devices: tuple[int, ...]


def _block_table(graph: Any) -> dict[int, _BlockInfo]:
  return {
      int(b.id): _BlockInfo(position=i, span=int(b.span),
                            memory=int(b.memory),
                            devices=tuple(int(d) for d in b.devices))
      for i, b in enumerate(graph.blocks)}


def check(schedule: Any,
          memory_limit: int | None | _Default = FROM_SCHEDULE
          ) -> list[Violation]:
  """Every violation of the DESIGN §3 rules in ``schedule``.

  Args:
    schedule: An ``UnrolledSchedule`` (anything with ``graph``, ``actions``,
      ``num_microbatches`` and ``memory_limit``).
    memory_limit: Per-device memory limit; by default the schedule's own
      ``memory_limit``. None skips the memory check.

  Returns:
    The violations, grouped by kind (in ``KINDS`` order) and sorted by step
    and device within a kind; empty when the schedule is valid.
  """
  if memory_limit is FROM_SCHEDULE:
    memory_limit = schedule.memory_limit
  graph = schedule.graph
  table = _block_table(graph)
  n = int(schedule.num_microbatches)
  found: dict[str, list[Violation]] = {k: [] for k in KINDS}

  # Well-formed actions: (block, micro-batch) -> start.
  start: dict[tuple[int, int], int] = {}
  for a in sorted(schedule.actions,
                  key=lambda a: (a.start, a.block, a.microbatch)):
    blk, mb, s = int(a.block), int(a.microbatch), int(a.start)
    info = table.get(blk)
    if info is None:
      found["extra"].append(Violation(
          "extra", f"action at step {s} names block {blk} (micro-batch {mb}),"
          f" which is not in the placement; its block ids are"
          f" {sorted(table)}", s, None, blk, mb))
    elif not 0 <= mb < n:
      found["extra"].append(Violation(
          "extra", f"block {blk} runs micro-batch {mb} at step {s}, but the"
          f" schedule has micro-batches 0..{n - 1}", s, info.devices[0], blk,
          mb))
    elif (blk, mb) in start:
      found["extra"].append(Violation(
          "extra", f"block {blk} of micro-batch {mb} runs twice: at step"
          f" {start[(blk, mb)]} and again at step {s}", s, info.devices[0],
          blk, mb))
    else:
      start[(blk, mb)] = s

  for blk, info in sorted(table.items(), key=lambda kv: kv[1].position):
    for mb in range(n):
      if (blk, mb) not in start:
        found["missing"].append(Violation(
            "missing", f"block {blk} of micro-batch {mb} is never scheduled",
            None, None, blk, mb))

  for (blk, mb), s in start.items():
    if s < 0:
      found["negative_start"].append(Violation(
          "negative_start", f"block {blk} of micro-batch {mb} starts at"
          f" step {s}; schedules start at step 0", s, table[blk].devices[0],
          blk, mb))

  _check_dependencies(graph, table, start, n, found["dependency"])
  _check_order(table, start, found["order"])
  _check_overlap(table, start, found["overlap"])
  if memory_limit is not None:
    _check_memory(table, start, int(memory_limit), found["memory"])

  out: list[Violation] = []
  for kind in KINDS:
    out.extend(sorted(found[kind], key=_sort_key))
  return out


def _sort_key(v: Violation) -> tuple[int, int, int, int]:
  return (v.step if v.step is not None else -(1 << 62),
          v.device if v.device is not None else -1,
          v.block if v.block is not None else -1,
          v.microbatch if v.microbatch is not None else -1)


def _check_dependencies(graph: Any, table: dict[int, _BlockInfo],
                        start: dict[tuple[int, int], int], n: int,
                        out: list[Violation]) -> None:
  for e in graph.edges:
    src, dst, delay = int(e.src), int(e.dst), int(e.delay)
    span = table[src].span
    for mb in range(n):
      if (src, mb) not in start or (dst, mb) not in start:
        continue  # reported as missing
      ready = start[(src, mb)] + span + delay
      s = start[(dst, mb)]
      if s < ready:
        out.append(Violation(
            "dependency", f"block {dst} of micro-batch {mb} starts at step"
            f" {s}, before its input from block {src} is ready at step"
            f" {ready} (start {start[(src, mb)]} + span {span} + delay"
            f" {delay})", s, table[dst].devices[0], dst, mb))


def _check_order(table: dict[int, _BlockInfo],
                 start: dict[tuple[int, int], int],
                 out: list[Violation]) -> None:
  by_block: dict[int, list[int]] = defaultdict(list)
  for blk, mb in start:
    by_block[blk].append(mb)
  for blk, mbs in by_block.items():
    mbs.sort()
    for prev, cur in zip(mbs, mbs[1:]):
      if start[(blk, cur)] <= start[(blk, prev)]:
        out.append(Violation(
            "order", f"block {blk} of micro-batch {cur} starts at step"
            f" {start[(blk, cur)]}, not after micro-batch {prev} at step"
            f" {start[(blk, prev)]}; micro-batches must run in order",
            start[(blk, cur)], table[blk].devices[0], blk, cur))


def _check_overlap(table: dict[int, _BlockInfo],
                   start: dict[tuple[int, int], int],
                   out: list[Violation]) -> None:
  per_device: dict[int, list[tuple[int, int, int, int]]] = defaultdict(list)
  for (blk, mb), s in start.items():
    info = table[blk]
    for d in info.devices:
      per_device[d].append((s, info.position, mb, blk))
  for d, items in per_device.items():
    items.sort()
    active: list[tuple[int, int, int]] = []  # (end, block, micro-batch)
    for s, _, mb, blk in items:
      active = [x for x in active if x[0] > s]
      for end, oblk, omb in active:
        out.append(Violation(
            "overlap", f"device {d}: block {blk} of micro-batch {mb} starts"
            f" at step {s} while block {oblk} of micro-batch {omb} occupies"
            f" the device until step {end}", s, d, blk, mb))
      active.append((s + table[blk].span, blk, mb))


def _check_memory(table: dict[int, _BlockInfo],
                  start: dict[tuple[int, int], int], limit: int,
                  out: list[Violation]) -> None:
  events: dict[int, dict[int, list[tuple[int, int, int]]]] = defaultdict(
      lambda: defaultdict(list))
  for (blk, mb), s in start.items():
    info = table[blk]
    for d in info.devices:
      events[d][s].append((info.memory, blk, mb))
  for d, steps in events.items():
    level = 0
    for t in sorted(steps):
      delta = sum(m for m, _, _ in steps[t])
      level += delta
      if level > limit and delta > 0:
        mem, blk, mb = max(steps[t], key=lambda x: (x[0], -x[1], -x[2]))
        culprit = (f"; block {blk} of micro-batch {mb} adds {mem}"
                   if mem > 0 else "")
        out.append(Violation(
            "memory", f"device {d}: memory is {level} after step {t}, above"
            f" the limit {limit}{culprit}", t, d,
            blk if mem > 0 else None, mb if mem > 0 else None))


def assert_valid(schedule: Any,
                 memory_limit: int | None | _Default = FROM_SCHEDULE) -> None:
  """Raises ``ScheduleValidationError`` unless ``schedule`` is valid.

  Args:
    schedule: An ``UnrolledSchedule``.
    memory_limit: As in ``check``.

  Raises:
    ScheduleValidationError: listing the first ``MAX_LISTED`` violations and
      how many more there are; ``.violations`` has them all.
  """
  violations = check(schedule, memory_limit)
  if violations:
    raise ScheduleValidationError(
        violations, name=str(getattr(schedule.graph, "name", "")))
