"""CP-SAT solvers whose answers depend only on the model and the seed.

``make_solver`` builds them (deterministic time limits, a safety net in
the solving thread's CPU seconds: ``clock``); ``StopWithin`` stops a memory
minimisation once a limit is decided; ``integer_bound`` reads a proven
bound.
"""

from __future__ import annotations

import math

from ortools.sat.python import cp_model

from tessel_jax.search import clock


def integer_bound(solver: cp_model.CpSolver) -> int | None:
  """CP-SAT's bound on an integer objective being minimised, rounded up
  (a bound of 4.3 proves 5; a tolerance keeps 5.0000001 at 5); None when
  CP-SAT has no finite bound."""
  bound = solver.BestObjectiveBound()
  return math.ceil(bound - 1e-6) if math.isfinite(bound) else None


class StopWithin(cp_model.CpSolverSolutionCallback):
  """Stops a memory minimisation once its answer relative to ``limit`` is
  known: a solution with peak ``<= limit``, or a bound above it."""

  def __init__(self, limit: int, solver: cp_model.CpSolver):
    super().__init__()
    self._limit = limit
    solver.best_bound_callback = self._on_bound

  def on_solution_callback(self) -> None:
    if self.ObjectiveValue() <= self._limit:
      self.StopSearch()

  def _on_bound(self, bound: float) -> None:
    if math.isfinite(bound) and math.ceil(bound - 1e-6) > self._limit:
      self.StopSearch()


# CPU seconds (of the solving thread: ``clock``) a solve may take per
# deterministic second before the safety net cuts it (``make_solver``). On
# this project's 2-core machine the LP-guided solves take 2.5-4.7 s per
# deterministic s; at 4 the net (then in wall seconds) cut them beside a
# second job: nnshape (4 devices, limit 13) missed P = 16 in a benchmark
# run beside another and found it alone. In wall seconds the net still cut
# solves at load 10 (a 3 deterministic s solve stopped after 1.2 of them,
# 25 s of wall and 3.4 s of CPU: its schedule then depended on the load);
# in CPU seconds the load does not move it. The period search's own cap
# (twice its budget) still bounds the whole search.
_CPU_PER_DETERMINISTIC_S = 8


def make_solver(time_limit_s: float, seed: int, num_workers: int,
                interleave: bool = True,
                linearization_level: int | None = None,
                cap_s: float | None = None) -> cp_model.CpSolver:
  """A CP-SAT solver whose result depends only on the model and the seed.

  Subsolvers are interleaved deterministically (``interleave_search``) and
  the cut-off is CP-SAT's deterministic time; as a safety net the solve
  also stops after ``_CPU_PER_DETERMINISTIC_S`` times the budget (plus
  1 s) of CPU seconds, or ``cap_s`` if less (``clock.CappedSolver``: CPU,
  not wall, seconds, so a loaded machine does not cut a solve short).
  Measured on vshape with 16 and 32 devices: with ``interleave_search`` one
  worker finds feasible repetends at large periods in milliseconds where
  the default single worker needs tens of seconds, and more interleaved
  workers were 8x slower in total. The
  completion models (thousands of hinted actions) are 30x faster without it
  (``interleave=False``). ``linearization_level=2`` adds the full LP
  relaxation (see ``solve_modulo``).
  """
  cap = _CPU_PER_DETERMINISTIC_S * max(0.01, time_limit_s) + 1
  if cap_s is not None:
    cap = min(cap, max(0.01, cap_s))
  solver = clock.CappedSolver(cap, num_workers)
  solver.parameters.max_deterministic_time = max(0.01, time_limit_s)
  solver.parameters.random_seed = seed
  solver.parameters.num_workers = num_workers
  solver.parameters.interleave_search = interleave
  if linearization_level is not None:
    solver.parameters.linearization_level = linearization_level
  return solver
