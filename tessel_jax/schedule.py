"""Schedule IR: a repetend plan (warmup + period + cooldown) and its unrolling.

Semantics (DESIGN.md §3): block ``b`` of micro-batch ``j`` runs in the steady
state at ``(k_b + j) * P + r_b`` where ``P`` is the period, ``k_b`` the
micro-batch offset and ``r_b`` the phase of ``b``. Iteration ``i`` of the
steady state runs block ``b`` of micro-batch ``i - k_b``; iterations
``K = max_b k_b`` .. ``N - 1`` are full. Everything before is the warmup and
everything after the cooldown; both are stored as templates that were
compacted by the search and are shifted to any ``N``.

``UnrolledSchedule`` is the fully timed action list for ``N`` micro-batches:
the DESIGN §4 output JSON and the IR that baselines produce too, so every
comparison is like for like.

No jax, no ortools here.
"""

from __future__ import annotations

import dataclasses
import json
import textwrap
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from tessel_jax import checks, simulate
from tessel_jax.graph import BlockGraph


class ScheduleError(checks.InputError):
  """A schedule cannot be built or unrolled; the message says why."""


@dataclasses.dataclass(frozen=True, order=True)
class Action:
  """Block ``block`` of micro-batch ``microbatch`` starts at step ``start``."""

  start: int
  block: int
  microbatch: int

  def to_dict(self) -> dict[str, int]:
    return {"block": self.block, "microbatch": self.microbatch,
            "start": self.start}


@dataclasses.dataclass(frozen=True)
class Repetend:
  """Steady state of a modulo schedule.

  Attributes:
    period: Steps per iteration ``P``.
    offsets: ``k_b`` per block, in graph block order (min is 0).
    phases: ``r_b`` per block in ``[0, P)``, in graph block order.
  """

  period: int
  offsets: tuple[int, ...]
  phases: tuple[int, ...]

  @property
  def max_offset(self) -> int:
    return max(self.offsets)

  @property
  def microbatches(self) -> int:
    """Micro-batches in flight in one period (``max k + 1``)."""
    return self.max_offset + 1

  def start_in_microbatch_frame(self, index: int) -> int:
    """Start of block at graph position ``index`` for micro-batch 0."""
    return self.offsets[index] * self.period + self.phases[index]

  def latency(self, spans: Sequence[int]) -> int:
    """Steps from the first start to the last end of one micro-batch.

    Args:
      spans: Span per block, in graph block order.
    """
    starts = [self.start_in_microbatch_frame(i) for i in range(len(spans))]
    return max(s + span for s, span in zip(starts, spans)) - min(starts)


@dataclasses.dataclass(frozen=True)
class Schedule:
  """A searched (or modulo) plan that unrolls to any number of micro-batches.

  Attributes:
    graph: The placement.
    repetend: The steady state.
    memory_limit: Per-device limit the plan respects (None: unlimited).
    warmup: Actions before the steady state; absolute micro-batch indices,
      starts relative to the start of the schedule.
    steady_start: Step at which steady iteration ``K`` starts.
    cooldown: Actions after the steady state; micro-batch indices relative to
      ``N`` (``-1`` is the last micro-batch), starts relative to the end of the
      last full iteration.
    status: Status of the period: ``OPTIMAL`` when no smaller period is
      feasible (proven by CP-SAT), else ``FEASIBLE``.
    period_lower_bound: Proven lower bound on the period.
    latency_status: CP-SAT status of minimising one micro-batch's latency at
      that period.
    latency_lower_bound: CP-SAT's proven bound on that latency.
    search_seconds: Wall time of the whole search (period, latency and
      warmup/cooldown).
    period_seconds: Wall time until the period was found (and, with status
      ``OPTIMAL``, proven minimal).
    source: Who made it (``"tessel"``, ``"1f1b"``, ...).
    cut_by_clock: Whether a safety net in CPU seconds cut the search
      before its deterministic budget (``search.clock``): only then may
      another run of the same search give another schedule (not part of
      equality or JSON).
    completer: Optional ``N -> actions`` used when ``N`` is too small for the
      templates (set by the search; not part of equality or JSON).
    alternative: Optional ``(N, beat=makespan) -> actions or None``: a
      non-periodic schedule of all ``N`` micro-batches under the same
      memory limit (the search's list scheduler), told the repetend's
      makespan to beat (it may skip work that cannot); ``unroll`` keeps it
      when its makespan is strictly shorter than the repetend's (not part
      of equality or JSON).
  """

  graph: BlockGraph
  repetend: Repetend
  memory_limit: int | None = None
  warmup: tuple[Action, ...] = ()
  steady_start: int = 0
  cooldown: tuple[Action, ...] = ()
  status: str = "FEASIBLE"
  period_lower_bound: int = 0
  latency_status: str = ""
  latency_lower_bound: int = 0
  search_seconds: float = 0.0
  period_seconds: float = 0.0
  source: str = "tessel"
  cut_by_clock: bool = dataclasses.field(default=False, compare=False)
  completer: Callable[[int], Sequence[Action]] | None = dataclasses.field(
      default=None, compare=False, repr=False)
  alternative: Callable[..., Sequence[Action] | None] | None = (
      dataclasses.field(default=None, compare=False, repr=False))
  _unrolled: dict[int, "UnrolledSchedule"] = dataclasses.field(
      default_factory=dict, init=False, compare=False, repr=False)

  @property
  def period(self) -> int:
    return self.repetend.period

  @property
  def latency(self) -> int:
    """Steps from the first start to the last end of one micro-batch."""
    return self.repetend.latency([b.span for b in self.graph.blocks])

  @property
  def min_template_microbatches(self) -> int:
    """Smallest N for which warmup and cooldown templates apply unchanged."""
    return max(1, 2 * self.repetend.max_offset)

  def steady_actions(self, num_microbatches: int) -> tuple[Action, ...]:
    """Actions of the full iterations ``K .. N-1`` for ``N`` micro-batches."""
    rep, g = self.repetend, self.graph
    first = rep.max_offset
    out = []
    for it in range(first, num_microbatches):
      base = self.steady_start + (it - first) * rep.period
      for index, block in enumerate(g.blocks):
        out.append(Action(base + rep.phases[index], block.id,
                          it - rep.offsets[index]))
    return tuple(out)

  def unroll(self, num_microbatches: int) -> "UnrolledSchedule":
    """Full timed action list for ``num_microbatches`` micro-batches.

    Uses the compacted warmup/cooldown templates when ``N`` is large enough,
    otherwise the search's completer (CP-SAT on all actions), otherwise the
    modulo schedule compacted to the left in its own order. When the search
    set an ``alternative`` (a list schedule of all ``N`` micro-batches) whose
    makespan is strictly shorter, that is returned instead, with ``period``
    None and ``source`` ending in ``-list``. For ``N <=
    SPLIT_MICROBATCHES`` it is also never longer than ``unroll(a)``
    followed by ``unroll(N - a)`` (compacted): where that is strictly
    shorter it is returned, with ``period`` None and ``source`` ending in
    ``-split`` (the splits are not tried when the unrolling already
    reaches ``simulate.lower_bound_makespan_shared``: none can be
    shorter). Results are memoised per ``N``.

    Raises:
      ScheduleError: if ``num_microbatches`` is not an integer >= 1 or is
        above ``checks.MAX_MICROBATCHES`` (or makes more than
        ``checks.MAX_ACTIONS`` actions).
    """
    n = checks.microbatches(num_microbatches, num_blocks=self.graph.num_blocks,
                            where="Schedule.unroll", error=ScheduleError)
    if n not in self._unrolled:
      best = self._unroll_once(n)
      if n <= SPLIT_MICROBATCHES and best.makespan > (
          simulate.lower_bound_makespan_shared(self.graph, n)):
        best = min([best] + [concatenate(self.unroll(a), self.unroll(n - a))
                             for a in range(1, n // 2 + 1)],
                   key=lambda u: u.makespan)
      self._unrolled[n] = best
    return self._unrolled[n]

  def _unroll_once(self, n: int) -> "UnrolledSchedule":
    """``unroll(n)`` without the split candidates (see :meth:`unroll`)."""
    if n >= self.min_template_microbatches and (self.warmup or self.cooldown
                                                 or self.repetend.max_offset == 0):
      end = self.steady_start + (n - self.repetend.max_offset) * self.period
      fixed = list(self.warmup) + list(self.steady_actions(n))
      cooldown = [Action(end + a.start, a.block, n + a.microbatch)
                  for a in self.cooldown]
      # The cooldown template was solved with a time limit: pull its actions
      # as early as the (pinned) steady state and their device order allow.
      # Same device orders, so the same memory levels.
      actions = list(compact_in_order(
          self.graph, fixed + cooldown,
          earliest={(a.block, a.microbatch): a.start for a in fixed}))
    elif self.completer is not None:
      actions = list(self.completer(n))
    else:
      actions = list(compact_in_order(self.graph, modulo_actions(self, n)))
    periodic = UnrolledSchedule(
        graph=self.graph, num_microbatches=n, actions=tuple(sorted(actions)),
        memory_limit=self.memory_limit, period=self.period,
        repetend_microbatches=self.repetend.microbatches, status=self.status,
        search_seconds=self.search_seconds, source=self.source)
    other = (None if self.alternative is None
             else self.alternative(n, beat=periodic.makespan))
    if other is None:
      return periodic
    listed = dataclasses.replace(periodic, actions=tuple(sorted(other)),
                                 period=None, repetend_microbatches=None,
                                 source=f"{self.source}-list")
    return listed if listed.makespan < periodic.makespan else periodic


def _refuse_constant(name: str) -> Any:
  raise ScheduleError(f"schedule JSON holds {name}; starts, blocks and"
                      " micro-batches must be finite integers")


#: ``unroll(N)`` for N up to this also tries every split ``a + (N - a)``.
SPLIT_MICROBATCHES = 8


def concatenate(first: "UnrolledSchedule", second: "UnrolledSchedule"
                ) -> "UnrolledSchedule":
  """``first`` then ``second`` (micro-batches renumbered after ``first``'s),
  pulled as early as each device's order allows.

  Valid under the same memory limit: every placement's memory returns to
  zero per device after a whole micro-batch, so ``second`` starts from the
  levels it was scheduled from, and compaction keeps every device's order
  (hence its memory levels).
  """
  shift, offset = first.makespan, first.num_microbatches
  actions = list(first.actions) + [
      Action(a.start + shift, a.block, a.microbatch + offset)
      for a in second.actions]
  actions = compact_in_order(first.graph, actions)
  source = first.source.removesuffix("-split").removesuffix("-list")
  return dataclasses.replace(
      first, num_microbatches=offset + second.num_microbatches,
      actions=tuple(sorted(actions)), period=None, repetend_microbatches=None,
      source=f"{source}-split")


def modulo_actions(schedule: Schedule, num_microbatches: int) -> tuple[Action, ...]:
  """The plain modulo schedule: block b of mb j at ``(k_b + j) P + r_b``."""
  rep = schedule.repetend
  return tuple(
      Action((rep.offsets[i] + j) * rep.period + rep.phases[i], b.id, j)
      for j in range(num_microbatches)
      for i, b in enumerate(schedule.graph.blocks))


def compact_in_order(graph: BlockGraph, actions: Iterable[Action],
                     earliest: Mapping[tuple[int, int], int] | None = None,
                     ) -> tuple[Action, ...]:
  """Starts every action as early as possible keeping each device's order.

  The order of actions on every device (by their given start, ties by
  block position) is kept, so the sequence of memory events on each device
  and hence its running memory is unchanged. Dependencies, edge delays and
  in-order micro-batches are respected.

  Args:
    graph: The placement.
    actions: Actions with any starts; the starts only define the order.
    earliest: Optional ``(block, micro-batch) -> step`` an action may not
      start before (pin an action by giving its own start).

  Returns:
    The left-compacted actions.

  Raises:
    ScheduleError: if the per-device orders deadlock against dependencies.
  """
  position = {b.id: i for i, b in enumerate(graph.blocks)}
  ordered = sorted(actions, key=lambda a: (a.start, position[a.block],
                                           a.microbatch))
  return schedule_in_device_order(graph, ordered, earliest)


def schedule_in_device_order(
    graph: BlockGraph, sequence: Sequence[Action],
    earliest: Mapping[tuple[int, int], int] | None = None,
) -> tuple[Action, ...]:
  """ASAP times for actions run on every device in the order of ``sequence``.

  ``sequence`` fixes a total priority order; each device executes its actions
  in that order, each action starting as soon as its dependencies (plus edge
  delays), its devices and the previous micro-batch's same block allow.
  Baselines are built this way from per-device orders.

  Raises:
    ScheduleError: if the orders deadlock (an action waits on one that is
      later on the same device).
  """
  key_of = [(a.block, a.microbatch) for a in sequence]
  if len(set(key_of)) != len(key_of):
    raise ScheduleError("an action appears twice in the sequence")
  # Constraint graph: dependency edges, device order, micro-batch order.
  preds: dict[tuple[int, int], list[tuple[tuple[int, int], int]]] = {
      k: [] for k in key_of}
  span = {b.id: b.span for b in graph.blocks}
  present = set(key_of)
  into: dict[int, list] = {b.id: [] for b in graph.blocks}
  for e in graph.edges:
    into[e.dst].append(e)
  for (blk, mb) in key_of:
    for e in into[blk]:
      if (e.src, mb) in present:
        preds[(blk, mb)].append(((e.src, mb), span[e.src] + e.delay))
  last_on_device: dict[int, tuple[int, int]] = {}
  last_of_block: dict[int, tuple[int, int]] = {}
  for key in key_of:
    blk = key[0]
    for d in graph.block(blk).devices:
      if d in last_on_device:
        prev = last_on_device[d]
        preds[key].append((prev, span[prev[0]]))
      last_on_device[d] = key
    if blk in last_of_block:
      preds[key].append((last_of_block[blk], 1))
    last_of_block[blk] = key
  # Longest path over the constraint DAG (Kahn's algorithm).
  succs: dict[tuple[int, int], list[tuple[int, int]]] = {k: [] for k in key_of}
  indegree = {k: len(v) for k, v in preds.items()}
  for k, plist in preds.items():
    for p, _ in plist:
      succs[p].append(k)
  start = {k: 0 for k in key_of}
  ready = [k for k in key_of if indegree[k] == 0]
  done = 0
  while ready:
    k = ready.pop()
    done += 1
    start[k] = max([start[p] + w for p, w in preds[k]] +
                   [earliest.get(k, 0) if earliest else 0])
    for s in succs[k]:
      indegree[s] -= 1
      if indegree[s] == 0:
        ready.append(s)
  if done != len(key_of):
    stuck = sorted(k for k in key_of if indegree[k] > 0)[:4]
    raise ScheduleError(
        "per-device orders deadlock against dependencies; e.g. (block,"
        f" micro-batch) {stuck} wait on actions placed after them on a device")
  return tuple(sorted(Action(start[k], k[0], k[1]) for k in key_of))


@dataclasses.dataclass(frozen=True)
class UnrolledSchedule:
  """Fully timed schedule for ``num_microbatches`` micro-batches (DESIGN §4).

  Attributes:
    graph: The placement.
    num_microbatches: N.
    actions: Every (block, micro-batch) once, sorted by start.
    memory_limit: Limit it was made for (None: unlimited).
    period: Period of the repetend (None for non-periodic baselines).
    repetend_microbatches: Micro-batches in flight in the repetend.
    status: Search status or ``"BASELINE"``.
    search_seconds: Search wall time.
    source: Who made it.
  """

  graph: BlockGraph
  num_microbatches: int
  actions: tuple[Action, ...]
  memory_limit: int | None = None
  period: int | None = None
  repetend_microbatches: int | None = None
  status: str = "FEASIBLE"
  search_seconds: float = 0.0
  source: str = "tessel"

  @property
  def makespan(self) -> int:
    """End of the last action."""
    return max((a.start + self.graph.block(a.block).span for a in self.actions),
               default=0)

  @property
  def peak_memory(self) -> tuple[int, ...]:
    """Largest running memory sum per device (starts at 0)."""
    level = [0] * self.graph.num_devices
    peak = [0] * self.graph.num_devices
    for a in sorted(self.actions):
      block = self.graph.block(a.block)
      for d in block.devices:
        level[d] += block.memory
        peak[d] = max(peak[d], level[d])
    return tuple(peak)

  def to_dict(self, include_timing: bool = True) -> dict[str, Any]:
    """The DESIGN §4 schedule JSON object.

    Args:
      include_timing: Write ``search_seconds`` (wall time). Leave it out to
        get byte-identical output for the same input and seed.
    """
    out: dict[str, Any] = {
        "placement": self.graph.name,
        "memory_limit": self.memory_limit,
        "num_microbatches": self.num_microbatches,
        "period": self.period,
        "repetend_microbatches": self.repetend_microbatches,
        "makespan": self.makespan,
        "peak_memory": list(self.peak_memory),
        "status": self.status,
        "source": self.source,
    }
    if include_timing:
      out["search_seconds"] = round(self.search_seconds, 4)
    out["actions"] = [a.to_dict() for a in self.actions]
    return out

  def to_json(self, include_timing: bool = True,
              indent: int | None = None) -> str:
    return json.dumps(self.to_dict(include_timing), indent=indent)

  @classmethod
  def from_dict(cls, data: Mapping[str, Any],
                graph: BlockGraph) -> "UnrolledSchedule":
    """Reads the DESIGN §4 JSON back, given the placement it was made for.

    Raises:
      ScheduleError: naming the field for a missing key, a wrong type
        (strings, booleans, NaN or fractions where integers belong) or an
        action out of range.
    """
    where = "schedule JSON"
    data = checks.mapping(data, "the schedule", where=where,
                          error=ScheduleError)
    if data.get("placement") not in (None, graph.name):
      raise ScheduleError(
          f"schedule JSON is for placement {data.get('placement')!r}, not"
          f" {graph.name!r}; pass the placement it was searched for")
    for key in ("num_microbatches", "actions"):
      if key not in data:
        raise ScheduleError(f"{where} has no {key!r} field (DESIGN.md §4)")
    n = checks.microbatches(data["num_microbatches"],
                            num_blocks=graph.num_blocks, where=where,
                            error=ScheduleError)
    actions = []
    for i, a in enumerate(checks.sequence(data["actions"], "actions",
                                          where=where, error=ScheduleError)):
      a = checks.mapping(a, f"actions[{i}]", where=where, error=ScheduleError)
      missing = {"start", "block", "microbatch"} - set(a)
      if missing:
        raise ScheduleError(f"{where}: actions[{i}] lacks {sorted(missing)}")
      actions.append(Action(
          checks.integer(a["start"], f"actions[{i}].start", low=0,
                         where=where, error=ScheduleError),
          checks.integer(a["block"], f"actions[{i}].block", where=where,
                         error=ScheduleError),
          checks.integer(a["microbatch"], f"actions[{i}].microbatch", low=0,
                         high=n - 1, where=where, error=ScheduleError)))
    limit = checks.memory_limit(data.get("memory_limit"), where=where,
                                error=ScheduleError)
    period = data.get("period")
    if period is not None:
      period = checks.integer(period, "period", low=1, where=where,
                              error=ScheduleError)
    rep = data.get("repetend_microbatches")
    if rep is not None:
      rep = checks.integer(rep, "repetend_microbatches", low=1, where=where,
                           error=ScheduleError)
    return cls(graph=graph, num_microbatches=n,
               actions=tuple(sorted(actions)), memory_limit=limit,
               period=period, repetend_microbatches=rep,
               status=str(data.get("status", "FEASIBLE")),
               search_seconds=checks.real(
                   data.get("search_seconds", 0.0), "search_seconds", low=0,
                   where=where, error=ScheduleError),
               source=str(data.get("source", "tessel")))

  @classmethod
  def from_json(cls, text: str, graph: BlockGraph) -> "UnrolledSchedule":
    """Parses DESIGN §4 schedule JSON text (see :meth:`from_dict`)."""
    try:
      data = json.loads(text, parse_constant=_refuse_constant)
    except (TypeError, json.JSONDecodeError) as err:
      raise ScheduleError(f"schedule JSON does not parse: {err}") from None
    return cls.from_dict(data, graph)

  def grid(self, max_steps: int | None = 64, cell: int = 0,
           width: int | None = 80, legend: bool = True) -> str:
    """Text picture, one row per device, one column per step.

    Each busy step shows ``<label>.<micro-batch>`` of the block that starts
    there (``F3.2``: forward block 3 of micro-batch 2; ``B3``/``W3`` its
    backward and weight gradient, the names the PNG, the Chrome trace and
    the JSON use), ``~`` where it continues and ``.`` where the device is
    idle. Columns fold into bands that fit ``width`` characters.

    Args:
      max_steps: Show only the first ``max_steps`` steps (None: all).
      cell: Column width (0: fit the widest label).
      width: Line width to fold at (None: one band, however wide).
      legend: End with a legend (symbols, shared blocks).
    """
    steps = self.makespan if max_steps is None else min(self.makespan, max_steps)
    rows = grid_cells(self, steps)
    cell = cell or max([len(c) for r in rows for c in r] + [len(str(steps))])
    per_band = steps if width is None else max(1, (width - 6) // (cell + 1))
    lines: list[str] = []
    for first in range(0, steps, per_band):
      cols = range(first, min(first + per_band, steps))
      if lines:
        lines.append("")
      lines.append("step  " + " ".join(str(t).rjust(cell) for t in cols))
      for d, row in enumerate(rows):
        lines.append(f"dev{d:<2} " + " ".join(row[t].rjust(cell) for t in cols))
    if steps < self.makespan:
      lines.append(f"... ({self.makespan - steps} more steps; makespan"
                   f" {self.makespan})")
    if legend:
      lines.extend(grid_legend(self.graph))
    return "\n".join(lines)


def grid_cells(schedule: UnrolledSchedule, steps: int) -> list[list[str]]:
  """Per device and step: ``label.mb`` at a start, ``~`` after, ``.`` idle."""
  graph = schedule.graph
  rows = [["." for _ in range(steps)] for _ in range(graph.num_devices)]
  for a in schedule.actions:
    block = graph.block(a.block)
    label = f"{block.label}.{a.microbatch}"
    for t in range(a.start, min(a.start + block.span, steps)):
      for d in block.devices:
        rows[d][t] = label if t == a.start else "~"
  return rows


def grid_legend(graph: BlockGraph, width: int = 80) -> list[str]:
  """Legend lines of :meth:`UnrolledSchedule.grid`, wrapped at ``width``."""
  kinds = {b.kind for b in graph.blocks}
  words = {"F": "forward", "B": "backward (input gradient)",
           "W": "weight gradient"}
  parts = [f"{k}i.m = {words[k]} of block i, micro-batch m"
           for k in "FBW" if k in kinds]
  parts += ["~ = still running", ". = idle", "one step = one time unit"]
  shared = [b.label for b in graph.blocks if len(b.devices) > 1]
  if shared:
    parts.append("shared by several devices: " + ", ".join(shared))
  text = "legend: " + "; ".join(parts)
  return textwrap.wrap(text, width=width, subsequent_indent="  ")
