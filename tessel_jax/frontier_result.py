"""What ``tj.frontier`` returns: candidate plans, their prices, the
Pareto set and the choice under a memory limit (frozen records with a JSON
round trip; no jax import)."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

from tessel_jax.search import frontier as _frontier


@dataclasses.dataclass(frozen=True)
class Candidate:
  """One plan before pricing.

  Attributes:
    placement: Placement name.
    pipe: Devices per pipeline.
    dp: Data-parallel replicas.
    microbatches: Micro-batches per step in all (``dp`` replicas).
    plan: None (searched) or a classic baseline's name.
    memory_limit: Bytes per device the search ran under (None: none).
  """

  placement: str
  pipe: int
  dp: int
  microbatches: int
  plan: str | None = None
  memory_limit: int | None = None

  @property
  def label(self) -> str:
    how = self.plan or "searched"
    limit = ("" if self.memory_limit is None else
             f"@{_frontier.size_label(self.memory_limit)}")
    return (f"{self.placement} pipe{self.pipe} dp{self.dp}"
            f" N{self.microbatches} {how}{limit}")

  @classmethod
  def from_dict(cls, data: dict[str, Any]) -> "Candidate":
    """Inverse of ``dataclasses.asdict``.

    Raises:
      KeyError, TypeError, ValueError: for a malformed record.
    """
    limit = data["memory_limit"]
    return cls(placement=str(data["placement"]), pipe=int(data["pipe"]),
               dp=int(data["dp"]), microbatches=int(data["microbatches"]),
               plan=None if data["plan"] is None else str(data["plan"]),
               memory_limit=None if limit is None else int(limit))


@dataclasses.dataclass(frozen=True)
class PricedPlan:
  """A priced plan.

  Attributes:
    candidate: What was built.
    step: Predicted step time in ms (measured costs) or the makespan in
      steps (``cost="uniform"``); see ``unit``.
    unit: ``"ms"`` or ``"steps"``.
    peak_bytes_per_device: Per device of the pipe axis (parameters,
      gradients, optimiser state, peak stash, workspace).
    source: Who made the schedule (``tessel``, ``tessel-list``, ``1f1b``...).
    blocks: Forward blocks of the placement.
    build_seconds: Seconds the pricing took.
    screened: Priced by the screening build only (the schedule searched on
      measured spans; a full build also tries the one searched on uniform
      spans and lowers the faster, so its step is at most this).
    bound: ``step`` is a lower bound: the plan's prediction without its
      stand-in program (``cost="calibrated"``) was already at or above the
      fastest fitting plan priced before it, so it cannot win and its
      stand-in was not timed (``CostModel.standin_bounds``).
  """

  candidate: Candidate
  step: float
  unit: str
  peak_bytes_per_device: tuple[int, ...]
  source: str
  blocks: int
  build_seconds: float
  screened: bool = False
  bound: bool = False

  @property
  def peak_bytes(self) -> int:
    return max(self.peak_bytes_per_device)

  @property
  def label(self) -> str:
    return self.candidate.label

  def to_dict(self) -> dict[str, Any]:
    out = dataclasses.asdict(self)
    out["label"] = self.label
    out["peak_bytes"] = self.peak_bytes
    return out

  @classmethod
  def from_dict(cls, data: dict[str, Any]) -> "PricedPlan":
    """Inverse of :meth:`to_dict`.

    Raises:
      KeyError, TypeError, ValueError: for a malformed record.
    """
    return cls(candidate=Candidate.from_dict(data["candidate"]),
               step=float(data["step"]), unit=str(data["unit"]),
               peak_bytes_per_device=tuple(
                   int(b) for b in data["peak_bytes_per_device"]),
               source=str(data["source"]), blocks=int(data["blocks"]),
               build_seconds=float(data["build_seconds"]),
               screened=bool(data["screened"]),
               bound=bool(data.get("bound", False)))


@dataclasses.dataclass(frozen=True)
class ProgramFrontier:
  """Every priced plan of a program and its Pareto set.

  Attributes:
    fn_name: The program.
    plans: Every priced plan.
    pareto: Indices of the plans no other beats in both step and peak.
    skipped: ``(what, why)`` of candidates that gave no plan.
    seconds: Wall seconds of the pricing.
  """

  fn_name: str
  plans: tuple[PricedPlan, ...]
  pareto: tuple[int, ...]
  skipped: tuple[tuple[str, str], ...] = ()
  seconds: float = 0.0

  def choose(self, memory_limit: int | None = None) -> PricedPlan | None:
    """The fastest plan whose peak fits ``memory_limit`` bytes per device
    (ties: the smaller peak, then the earlier plan); None if none fits."""
    i = choose_index(self.plans, memory_limit)
    return None if i is None else self.plans[i]

  def runner_up(self, memory_limit: int | None = None) -> PricedPlan | None:
    """The next fastest fitting plan of another placement, width or N."""
    best = self.choose(memory_limit)
    if best is None:
      return None
    key = shape_of(best.candidate)
    rest = [p for p in self.plans if shape_of(p.candidate) != key]
    i = choose_index(rest, memory_limit)
    return None if i is None else rest[i]

  def smallest_peak(self) -> PricedPlan | None:
    return min(self.plans, key=lambda p: (p.peak_bytes, p.step),
               default=None)

  def plot(self, path: str, memory_limit: int | None = None) -> str:
    """Step against peak memory, the Pareto set joined and the plan chosen
    for ``memory_limit`` circled (as ``experiments.frontier_plot`` draws a
    sweep); returns ``path``."""
    from tessel_jax import plot as _plot  # pylint: disable=import-outside-toplevel
    return _plot.frontier_scatter(
        [(p.peak_bytes, p.step, p.candidate.placement,
          p.candidate.plan is not None) for p in self.plans],
        self.pareto, path, title=f"plans of {self.fn_name!r}",
        step_unit=self.plans[0].unit if self.plans else "ms",
        chosen=choose_index(self.plans, memory_limit),
        memory_limit=memory_limit)

  def to_dict(self) -> dict[str, Any]:
    return {"fn": self.fn_name, "plans": [p.to_dict() for p in self.plans],
            "pareto": list(self.pareto), "skipped": [list(s) for s in
                                                     self.skipped],
            "seconds": round(self.seconds, 3)}

  @classmethod
  def from_dict(cls, data: dict[str, Any]) -> "ProgramFrontier":
    """Inverse of :meth:`to_dict`.

    Raises:
      KeyError, TypeError, ValueError: for a malformed record.
    """
    plans = tuple(PricedPlan.from_dict(p) for p in data["plans"])
    pareto_set = tuple(int(i) for i in data["pareto"])
    if any(not 0 <= i < len(plans) for i in pareto_set):
      raise ValueError("a Pareto index out of range")
    return cls(fn_name=str(data["fn"]), plans=plans, pareto=pareto_set,
               skipped=tuple((str(w), str(y)) for w, y in data["skipped"]),
               seconds=float(data["seconds"]))

  def __str__(self) -> str:
    lines = [f"{len(self.plans)} plans of {self.fn_name!r}"
             f" ({self.seconds:.1f} s; * = Pareto set)"]
    for j in sorted(range(len(self.plans)), key=lambda k: self.plans[k].step):
      q = self.plans[j]
      mark = "*" if j in self.pareto else " "
      lines.append(f" {mark} {q.label:<40} step {q.step:10.3f} {q.unit}"
                   f"  peak {q.peak_bytes / 2**20:9.3f} MiB  ({q.source})")
    return "\n".join(lines)


def shape_of(c: Candidate) -> tuple[str, int, int, int]:
  """What a plan is apart from its schedule: placement, widths and N."""
  return (c.placement, c.pipe, c.dp, c.microbatches)


def choose_index(plans: Sequence[PricedPlan],
                 memory_limit: int | None) -> int | None:
  """Index of the fastest plan that fits (ties: smaller peak, earlier)."""
  fits = [i for i, p in enumerate(plans)
          if memory_limit is None or p.peak_bytes <= memory_limit]
  if not fits:
    return None
  return min(fits, key=lambda i: (plans[i].step, plans[i].peak_bytes, i))


def pareto(plans: Sequence[PricedPlan]) -> tuple[int, ...]:
  """Indices of the Pareto set of ``plans`` (step, peak bytes)."""
  return _frontier.pareto_indices([(p.step, p.peak_bytes) for p in plans])
