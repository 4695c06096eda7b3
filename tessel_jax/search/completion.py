"""Completion: compact the warmup and cooldown around a repetend with CP-SAT.

The steady state (full iterations ``K .. N-1``, ``K = max_b k_b``) is rigid.
The warmup holds the actions of iterations ``< K`` and the cooldown those of
iterations ``>= N``; both are re-timed by CP-SAT under the same memory limit:

* warmup: minimise the step ``S`` at which steady iteration ``K`` starts;
  every warmup action on device ``d`` ends before the first steady action of
  ``d`` (at ``S + min r_b``), so the warmup's memory events precede the steady
  ones on every device and a reservoir constraint from level 0 is exact;
* cooldown: minimise the last end, every cooldown action on ``d`` starting
  after the last steady action of ``d`` ends; the level at the start is the
  steady level, ``-sum`` of the cooldown's own memory on ``d``.

For ``N >= 2K`` no micro-batch has actions in both the warmup and the
cooldown, so the two templates are independent of ``N`` and are shifted by
``Schedule.unroll``. Smaller ``N`` are solved whole (``complete_all``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from ortools.sat.python import cp_model

from tessel_jax import simulate
from tessel_jax.graph import BlockGraph
from tessel_jax.schedule import Action, Repetend, compact_in_order
from tessel_jax.search.cpsat import make_solver

_NO_FLOOR = -(10**12)


class CompletionError(RuntimeError):
  """CP-SAT found no warmup/cooldown under the memory limit in time."""


@dataclasses.dataclass(frozen=True)
class Templates:
  """Compacted warmup and cooldown (see ``tessel_jax.schedule.Schedule``)."""

  warmup: tuple[Action, ...]
  steady_start: int
  cooldown: tuple[Action, ...]
  status: str


@dataclasses.dataclass(frozen=True)
class _Task:
  """One action to time: block position ``index`` of micro-batch ``mb``."""

  index: int
  mb: int


class _ActionModel:
  """Shared CP-SAT pieces: free actions, devices, edges, order, memory."""

  def __init__(self, graph: BlockGraph, tasks: Sequence[_Task], low: int,
               high: int):
    self.graph = graph
    self.model = cp_model.CpModel()
    self.tasks = list(tasks)
    self.key = {(t.index, t.mb): n for n, t in enumerate(self.tasks)}
    self.start = []
    self.intervals = []
    for t in self.tasks:
      block = graph.blocks[t.index]
      s = self.model.NewIntVar(low, high, f"s_{block.id}_{t.mb}")
      self.start.append(s)
      self.intervals.append(self.model.NewFixedSizeIntervalVar(
          s, block.span, f"I_{block.id}_{t.mb}"))
    self.pos = {b.id: i for i, b in enumerate(graph.blocks)}
    self.hint: list[int] = []

  def span(self, n: int) -> int:
    return self.graph.blocks[self.tasks[n].index].span

  def end(self, n: int):
    return self.start[n] + self.span(n)

  def devices(self, n: int) -> tuple[int, ...]:
    return self.graph.blocks[self.tasks[n].index].devices

  def add_no_overlap(self) -> None:
    for d in range(self.graph.num_devices):
      ivs = [self.intervals[n] for n in range(len(self.tasks))
             if d in self.devices(n)]
      if len(ivs) > 1:
        self.model.AddNoOverlap(ivs)

  def add_edges_between_free(self) -> None:
    for e in self.graph.edges:
      src, dst = self.pos[e.src], self.pos[e.dst]
      for n, t in enumerate(self.tasks):
        if t.index == dst and (src, t.mb) in self.key:
          m = self.key[(src, t.mb)]
          self.model.Add(self.start[n] >= self.end(m) + e.delay)

  def add_microbatch_order(self) -> None:
    for n, t in enumerate(self.tasks):
      prev = self.key.get((t.index, t.mb - 1))
      if prev is not None:
        self.model.Add(self.start[n] >= self.start[prev] + 1)

  def add_memory(self, limit: int | None, initial: dict[int, int],
                 initial_time: int) -> None:
    if limit is None:
      return
    for d in range(self.graph.num_devices):
      times, changes = [], []
      if initial.get(d):
        times.append(initial_time)
        changes.append(initial[d])
      for n, t in enumerate(self.tasks):
        block = self.graph.blocks[t.index]
        if d in block.devices and block.memory != 0:
          times.append(self.start[n])
          changes.append(block.memory)
      if changes:
        self.model.AddReservoirConstraint(times, changes, _NO_FLOOR, limit)

  def compacted_hint(self, limit: int | None) -> tuple[Action, ...] | None:
    """The modulo hint pulled in (same device orders, so the same memory
    levels); None when those levels exceed ``limit``."""
    if not self._fits(self.hint, limit, {}):
      return None
    return compact_in_order(self.graph, [
        Action(start, self.graph.blocks[t.index].id, t.mb)
        for start, t in zip(self.hint, self.tasks)])

  def hint_modulo(self, rep: Repetend,
                  earliest: Sequence[int] | None = None) -> None:
    """Hints every action at its plain modulo time ``(k_b + j) P + r_b``;
    with ``earliest`` (a least start per task, the model's bounds towards
    the steady state), at that time pulled as early as its device order
    allows (``compact_in_order``: same orders, so the same memory levels).

    The pulled-in hint is a far better first solution: nnshape, 8 devices,
    limit 20, without wrap-around (P = 8, latency 111): the cooldown's
    plain modulo hint ends 103 steps after the steady state, pulled in 69;
    CP-SAT from the plain hint found 94 in 0.5 s, 82 in 2 s.
    """
    self.hint = [(rep.offsets[t.index] + t.mb) * rep.period +
                 rep.phases[t.index] for t in self.tasks]
    if earliest is not None:
      pulled = compact_in_order(self.graph, [
          Action(start, self.graph.blocks[t.index].id, t.mb)
          for start, t in zip(self.hint, self.tasks)], earliest={
              (self.graph.blocks[t.index].id, t.mb): low
              for t, low in zip(self.tasks, earliest)})
      at = {(a.block, a.microbatch): a.start for a in pulled}
      self.hint = [at[(self.graph.blocks[t.index].id, t.mb)]
                   for t in self.tasks]
    for var, value in zip(self.start, self.hint):
      self.model.AddHint(var, value)

  def solve(self, time_limit_s: float, seed: int, num_workers: int,
            solve: bool = True):
    """CP-SAT on the model; without ``solve``, none (``(None, UNKNOWN)``:
    ``starts`` then gives the hint)."""
    if not solve:
      return None, cp_model.UNKNOWN
    solver = make_solver(time_limit_s, seed, num_workers, interleave=False)
    code = solver.Solve(self.model)
    return solver, code

  def starts(self, solver: cp_model.CpSolver | None, code: int, what: str,
             limit: int | None, initial: dict[int, int] | None = None,
             ) -> tuple[list[int], str]:
    """Solved starts; the modulo hint if CP-SAT ran out of time first.

    The hint meets every constraint but memory by construction, so it is
    used when its memory levels stay under ``limit``.

    Raises:
      CompletionError: if neither CP-SAT nor the hint gives a schedule.
    """
    if code in (cp_model.OPTIMAL, cp_model.FEASIBLE):
      return [solver.Value(v) for v in self.start], solver.StatusName(code)
    if code != cp_model.INFEASIBLE and self._fits(self.hint, limit,
                                                  initial or {}):
      return list(self.hint), "MODULO"
    how = ("not solved" if solver is None
           else f"CP-SAT {solver.StatusName(code)}")
    raise CompletionError(
        f"no {what} fits under memory limit {limit} for placement"
        f" {self.graph.name!r} ({how}); raise the limit or the search time"
        " limit")

  def _fits(self, starts: Sequence[int], limit: int | None,
            initial: dict[int, int]) -> bool:
    if limit is None:
      return True
    for d in range(self.graph.num_devices):
      events = sorted((s, self.graph.blocks[t.index].memory)
                      for s, t in zip(starts, self.tasks)
                      if d in self.graph.blocks[t.index].devices)
      level = initial.get(d, 0)
      for n, (time, change) in enumerate(events):
        level += change
        if (n + 1 == len(events) or events[n + 1][0] != time) and level > limit:
          return False
    return True


def _first_phase_on(graph: BlockGraph, rep: Repetend, d: int) -> int:
  return min(rep.phases[i] for i, b in enumerate(graph.blocks)
             if d in b.devices)


def _last_end_on(graph: BlockGraph, rep: Repetend, d: int) -> int:
  """End of device d's last steady action, relative to the end of the last
  full iteration."""
  return max(rep.phases[i] + b.span - rep.period
             for i, b in enumerate(graph.blocks) if d in b.devices)


def _earliest_steady_start(graph: BlockGraph, rep: Repetend,
                           warmup: Sequence[Action]) -> int:
  """Smallest steady start ``S`` the (compacted) warmup allows."""
  pos = {b.id: i for i, b in enumerate(graph.blocks)}
  first = rep.max_offset
  steady = 0
  for a in warmup:
    block = graph.blocks[pos[a.block]]
    end = a.start + block.span
    for d in block.devices:  # warmup ends before the device's steady work
      steady = max(steady, end - _first_phase_on(graph, rep, d))
    for e in graph.successors(a.block):  # edges into the steady state
      dst = pos[e.dst]
      iteration = a.microbatch + rep.offsets[dst]
      if iteration >= first:
        steady = max(steady, end + e.delay - (iteration - first) * rep.period
                     - rep.phases[dst])
  return steady


def compact_warmup(graph: BlockGraph, rep: Repetend, memory_limit: int | None,
                   *, time_limit_s: float = 10.0, seed: int = 0,
                   num_workers: int = 1, solve: bool = True
                   ) -> tuple[tuple[Action, ...], int, str]:
  """Returns (warmup actions, steady start S, CP-SAT status; ``MODULO``:
  the modulo schedule pulled in, CP-SAT found nothing or, without
  ``solve``, did not run)."""
  first = rep.max_offset
  tasks = [_Task(i, j) for i, _ in enumerate(graph.blocks)
           for j in range(first - rep.offsets[i])]
  modulo_start = first * rep.period
  if not tasks:
    return (), 0, "OPTIMAL"
  horizon = modulo_start + sum(b.span for b in graph.blocks) + sum(
      e.delay for e in graph.edges)
  am = _ActionModel(graph, tasks, 0, horizon)
  model = am.model
  steady = model.NewIntVar(0, horizon, "steady_start")

  # --- Warmup ends, per device, before that device's first steady action ---
  for n in range(len(tasks)):
    for d in am.devices(n):
      model.Add(am.end(n) <= steady + _first_phase_on(graph, rep, d))
  # --- Edges: inside the warmup, and from the warmup into the steady state --
  am.add_edges_between_free()
  for e in graph.edges:
    src, dst = am.pos[e.src], am.pos[e.dst]
    for n, t in enumerate(tasks):
      if t.index == src and (dst, t.mb) not in am.key:
        iteration = t.mb + rep.offsets[dst]
        model.Add(am.end(n) + e.delay <= steady + (iteration - first) *
                  rep.period + rep.phases[dst])
  am.add_microbatch_order()
  am.add_no_overlap()
  am.add_memory(memory_limit, {}, 0)

  # --- Hint: the modulo schedule pulled in; objective: earliest steady state
  am.hint_modulo(rep, earliest=[0] * len(tasks))
  model.AddHint(steady, _earliest_steady_start(graph, rep, [
      Action(start, graph.blocks[t.index].id, t.mb)
      for start, t in zip(am.hint, tasks)]))
  model.Minimize(steady)
  solver, code = am.solve(time_limit_s, seed, num_workers, solve)
  starts, status = am.starts(solver, code, "warmup", memory_limit)
  timed = [Action(start, graph.blocks[t.index].id, t.mb)
           for start, t in zip(starts, tasks)]
  # Then every warmup action as early as its device order allows (the
  # familiar 1F1B-style warmup). Keeping each device's order keeps its
  # memory levels, and moving earlier keeps every bound towards the steady
  # state; done here rather than as a CP-SAT objective, which made proofs of
  # optimality 100x slower. The steady start then follows from the
  # compacted warmup (never later than CP-SAT's).
  warmup = compact_in_order(graph, timed)
  return warmup, _earliest_steady_start(graph, rep, warmup), status


def _cooldown_earliest(graph: BlockGraph, rep: Repetend,
                       tasks: Sequence[_Task]) -> list[int]:
  """Least start of each cooldown task (relative to the steady end): after
  its devices' last steady actions end, and after its inputs computed in
  the steady state (with their delays)."""
  pos = {b.id: i for i, b in enumerate(graph.blocks)}
  present = {(t.index, t.mb) for t in tasks}
  out = []
  for t in tasks:
    low = max(_last_end_on(graph, rep, d)
              for d in graph.blocks[t.index].devices)
    for e in graph.edges:
      src = pos[e.src]
      if pos[e.dst] == t.index and (src, t.mb) not in present:
        iteration = t.mb + rep.offsets[src]  # relative to N, so < 0
        low = max(low, iteration * rep.period + rep.phases[src]
                  + graph.blocks[src].span + e.delay)
    out.append(low)
  return out


def compact_cooldown(graph: BlockGraph, rep: Repetend, memory_limit: int | None,
                     *, time_limit_s: float = 10.0, seed: int = 0,
                     num_workers: int = 1, solve: bool = True
                     ) -> tuple[tuple[Action, ...], str]:
  """Returns (cooldown actions relative to N and to the steady end, status
  as ``compact_warmup``'s)."""
  tasks = [_Task(i, -j) for i, _ in enumerate(graph.blocks)
           for j in range(1, rep.offsets[i] + 1)]
  if not tasks:
    return (), "OPTIMAL"
  horizon = (rep.max_offset + 1) * rep.period + sum(
      b.span for b in graph.blocks) + sum(e.delay for e in graph.edges)
  am = _ActionModel(graph, tasks, -rep.period, horizon)
  model = am.model

  # --- Cooldown starts, per device, after that device's last steady end, --
  # --- and after its inputs from the steady state; edges inside it --------
  earliest = _cooldown_earliest(graph, rep, tasks)
  for n in range(len(tasks)):
    model.Add(am.start[n] >= earliest[n])
  am.add_edges_between_free()
  am.add_microbatch_order()
  am.add_no_overlap()
  initial = {}
  for d in range(graph.num_devices):
    initial[d] = -sum(graph.blocks[t.index].memory for t in tasks
                      if d in graph.blocks[t.index].devices)
  am.add_memory(memory_limit, initial, -rep.period - 1)

  # --- Hint: the modulo schedule pulled in; objective: earliest last end ---
  am.hint_modulo(rep, earliest=earliest)
  last = model.NewIntVar(-rep.period, horizon + rep.period, "last_end")
  model.AddHint(last, max(start + am.span(n)
                          for n, start in enumerate(am.hint)))
  model.AddMaxEquality(last, [am.end(n) for n in range(len(tasks))])
  model.Minimize(last)
  solver, code = am.solve(time_limit_s, seed, num_workers, solve)
  starts, status = am.starts(solver, code, "cooldown", memory_limit, initial)
  return tuple(sorted(Action(start, graph.blocks[t.index].id, t.mb)
                      for start, t in zip(starts, tasks))), status


def compact_templates(graph: BlockGraph, rep: Repetend,
                      memory_limit: int | None, *, time_limit_s: float = 10.0,
                      seed: int = 0, num_workers: int = 1,
                      solve: bool = True) -> Templates:
  """Warmup and cooldown templates for ``rep`` (valid for ``N >= 2K``).

  Their ``status``: ``OPTIMAL`` when CP-SAT proved both ramps, ``MODULO``
  when it found neither (both are the modulo schedule pulled in: its time
  ran out before a solution, or ``solve`` is False and it did not run),
  else ``FEASIBLE``.

  Raises:
    CompletionError: if a ramp has no schedule under the limit (the pulled
      in modulo schedule over it and CP-SAT without a solution).
  """
  warmup, steady_start, s1 = compact_warmup(
      graph, rep, memory_limit, time_limit_s=time_limit_s / 2, seed=seed,
      num_workers=num_workers, solve=solve)
  cooldown, s2 = compact_cooldown(
      graph, rep, memory_limit, time_limit_s=time_limit_s / 2, seed=seed,
      num_workers=num_workers, solve=solve)
  status = ("OPTIMAL" if s1 == s2 == "OPTIMAL" else
            "MODULO" if s1 == s2 == "MODULO" else "FEASIBLE")
  return Templates(warmup, steady_start, cooldown, status)


#: Largest ``sum_d n_d^2`` (``n_d``: actions that change device ``d``'s
#: memory) of a ``complete_all`` model with a memory limit: CP-SAT expands
#: each device's reservoir constraint into about ``n_d^2`` literals
#: (nnshape, 32 devices, N = 128, about 1000 actions a device, 33M: 15 GiB,
#: killed for memory). Above it the modulo schedule is pulled in instead.
MAX_RESERVOIR_PAIRS = 10_000_000


def _reservoir_pairs(graph: BlockGraph, num_microbatches: int) -> int:
  """``sum_d n_d^2`` for ``num_microbatches`` micro-batches (see
  ``MAX_RESERVOIR_PAIRS``)."""
  per_device = [0] * graph.num_devices
  for b in graph.blocks:
    if b.memory != 0:
      for d in b.devices:
        per_device[d] += num_microbatches
  return sum(n * n for n in per_device)


def complete_all(graph: BlockGraph, rep: Repetend, num_microbatches: int,
                 memory_limit: int | None, *, time_limit_s: float = 10.0,
                 seed: int = 0, num_workers: int = 1,
                 use_bound: bool = True) -> tuple[Action, ...]:
  """Times all ``N`` micro-batches at once (for ``N`` below the templates).

  Minimises the makespan, hinted with the modulo schedule. With
  ``use_bound`` the makespan is known to be at least
  ``simulate.lower_bound_makespan_shared``: when the compacted modulo
  schedule fits the limit and reaches that bound it is returned without a
  solve, and CP-SAT is told the bound, so it stops as soon as it reaches it
  instead of spending its whole budget failing to prove it (README GPT, 4
  devices: most small-N completions end at the bound).

  Raises:
    CompletionError: if CP-SAT finds no schedule under the limit in time.
  """
  tasks = [_Task(i, j) for j in range(num_microbatches)
           for i, _ in enumerate(graph.blocks)]
  horizon = (rep.max_offset + num_microbatches + 1) * rep.period + sum(
      b.span for b in graph.blocks) + sum(e.delay for e in graph.edges)
  am = _ActionModel(graph, tasks, 0, horizon)
  am.hint_modulo(rep)
  too_large = memory_limit is not None and _reservoir_pairs(
      graph, num_microbatches) > MAX_RESERVOIR_PAIRS
  bound = (simulate.lower_bound_makespan_shared(graph, num_microbatches)
           if use_bound else None)
  if too_large or bound is not None:
    modulo = am.compacted_hint(memory_limit)
    if modulo is not None and (too_large or _makespan(graph, modulo) <= bound):
      return modulo  # at the lower bound: nothing to solve
    if too_large:  # too large for CP-SAT's memory rule
      raise CompletionError(
          f"no schedule of {num_microbatches} micro-batches fits under"
          f" memory limit {memory_limit} for placement {graph.name!r} (too"
          " large to solve); raise the limit or unroll more micro-batches")
  am.add_edges_between_free()
  am.add_microbatch_order()
  am.add_no_overlap()
  am.add_memory(memory_limit, {}, 0)
  last = am.model.NewIntVar(bound or 0, max(bound or 0, horizon + rep.period),
                            "makespan")
  am.model.AddMaxEquality(last, [am.end(n) for n in range(len(tasks))])
  am.model.Minimize(last)
  solver, code = am.solve(time_limit_s, seed, num_workers)
  if code == cp_model.INFEASIBLE and bound:
    # Only if the bound were wrong: solve as without it.
    return complete_all(graph, rep, num_microbatches, memory_limit,
                        time_limit_s=time_limit_s, seed=seed,
                        num_workers=num_workers, use_bound=False)
  starts, status = am.starts(solver, code,
                             f"schedule of {num_microbatches} micro-batches",
                             memory_limit)
  timed = [Action(start, graph.blocks[t.index].id, t.mb)
           for start, t in zip(starts, tasks)]
  return compact_in_order(graph, timed) if status == "MODULO" else tuple(
      sorted(timed))


def _makespan(graph: BlockGraph, actions: Sequence[Action]) -> int:
  span = {b.id: b.span for b in graph.blocks}
  return max((a.start + span[a.block] for a in actions), default=0)
