"""The solves of one period search (``Prober``): relaxations first, each
solve's work charged to the search's budget."""

from __future__ import annotations

import dataclasses

from tessel_jax.graph import BlockGraph
from tessel_jax.search.budget import Budget
from tessel_jax.search.modulo_model import solve_modulo
from tessel_jax.search.modulo_moves import drop_idle_steps, moved_to_period
from tessel_jax.search.modulo_solution import ModuloSolution


# Least share of the budget a relaxed proof may take per period
# (``Prober``; the decisive probe's share where larger): the
# subgraph's proofs take 0.01-2 deterministic s, the pooled model's up to 9.
_RELAXATION_SHARE = 1 / 8


@dataclasses.dataclass
class Prober:
  """The solves of one search (``search_repetend``): a period's solve is
  first tried on the relaxations, every solve's work is charged to the
  budget, and the periods whose feasibility was asked are recorded.

  Attributes:
    graph, memory_limit: The search's placement and limit.
    budget: The search's budget.
    solve_kw: ``allow_wrap``, ``seed`` and ``num_workers`` for CP-SAT.
    low: The smallest period the bounds allow.
    relaxed: The placement's relaxations (``relaxation.relaxations``).
    tried: Periods whose feasibility was asked.
    constructed: Whether the period search's repetend was built without a
      solve (``period_search.first_probe``): its latency was not
      minimised, so its polish gets what a ``start`` repetend's does.
    construct_s: CPU seconds the constructive scheduler took (no CP-SAT
      work: ``polish_budget``'s CPU per deterministic second leaves them
      out).
  """

  graph: BlockGraph
  memory_limit: int | None
  budget: Budget
  solve_kw: dict
  low: int
  relaxed: list
  tried: set[int] = dataclasses.field(default_factory=set)
  constructed: bool = False
  construct_s: float = 0.0

  def __call__(self, period: int, share: float = 1.0,
               descending: bool = False, seconds: float | None = None,
               **kw) -> ModuloSolution:
    """A solve at ``period`` with ``share`` of the budget (or ``seconds``);
    ``kw`` go to ``solve_modulo`` (``objective``, ``hint``, ...)."""
    budget = self.budget
    # Relaxations first (feasibility only). The pooled one has every block,
    # so it is only worth its time below a repetend found, where proofs are
    # what is missing, and above the smallest period, where a limit that
    # admits it only delays the find (nnshape, 4 devices, limit 13, P = 16:
    # 6.2 s to find the pooled model feasible).
    for relaxation in self.relaxed if "objective" not in kw else ():
      if relaxation.pooled and (not descending or period == self.low):
        continue
      proven, work = relaxation.proves_infeasible(
          period, budget.left(max(share, _RELAXATION_SHARE)),
          hint=kw.get("hint"), cap_s=budget.cap_left())
      budget.spend(work)
      if proven:
        self.tried.add(period)
        return ModuloSolution("INFEASIBLE", work=work)
    sol = solve_modulo(self.graph, period, self.memory_limit,
                       time_limit_s=budget.left(share) if seconds is None
                       else seconds,
                       cap_s=budget.cap_left(), **self.solve_kw, **kw)
    budget.spend(sol.work)
    if "objective" not in kw:
      self.tried.add(period)
    return sol

  def shorten(self, found: tuple) -> tuple:
    """``found`` with the steps idle on every device dropped."""
    return drop_idle_steps(self.graph, *found)

  def hint_at(self, found: tuple, period: int) -> ModuloSolution:
    """``found`` moved to ``period`` (a hint for a solve there)."""
    return moved_to_period(self.graph, *found, period)
