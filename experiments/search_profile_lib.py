"""Where a ``search_repetend`` spends its CPU seconds: every CP-SAT solve
of the modulo model with its step of the search, objective, budget,
status, deterministic and CPU seconds, and the CPU seconds per step.

Used by ``search_cases_fast --profile``. The steps are the search's own
functions (``period_search.first_probe`` and ``after_first_probe``, the
same two run again by ``compose.shorter_of_scratch``, ``compose.polished``
and ``compose.composed`` or, for a built repetend,
``compose.built_composed``); the solves are ``modulo_model``'s stages (the
interleaved portfolio, memory minimisation without and with the LP), so a
row says which stage of which probe took the time. The spies are installed
only inside ``profiled()`` and removed on exit.
"""

from __future__ import annotations

import contextlib
import dataclasses
import time
from typing import Any, Iterator

from tessel_jax.search import compose, modulo_model, period_search

# (module, function, step): the search's steps, outermost first.
_STEPS = (
    (period_search, "first_probe", "first_probe"),
    (period_search, "after_first_probe", "after_first_probe"),
    (compose, "first_probe", "scratch_first_probe"),
    (compose, "after_first_probe", "scratch_after_first_probe"),
    (compose, "polished", "latency_polish"),
    (compose, "composed", "ramps"),
    (compose, "built_composed", "ramps"),
)


@dataclasses.dataclass
class Profile:
  """What one ``profiled()`` block recorded.

  Attributes:
    solves: One dict per CP-SAT stage solve of the modulo model (step,
      graph, period, memory limit, objective, LP level, deterministic
      budget, status, deterministic and CPU seconds), in call order.
    step_cpu_s: CPU seconds per step (outermost call of each step; the
      ramps' completion solves are in ``ramps``, not in ``solves``).
  """

  solves: list[dict[str, Any]] = dataclasses.field(default_factory=list)
  step_cpu_s: dict[str, float] = dataclasses.field(default_factory=dict)
  _step: str = "other"

  def summary(self) -> dict[str, Any]:
    """CPU and deterministic seconds of the solves per step, and the CPU
    seconds of each step."""
    per_step: dict[str, list] = {}
    for s in self.solves:
      n, cpu, det = per_step.get(s["step"], (0, 0.0, 0.0))
      per_step[s["step"]] = (n + 1, cpu + s["cpu_s"], det + s["det_s"])
    return {
        "step_cpu_s": {k: round(v, 2) for k, v in self.step_cpu_s.items()},
        "solves_per_step": {k: {"solves": n, "cpu_s": round(c, 2),
                                "det_s": round(d, 3)}
                            for k, (n, c, d) in per_step.items()}}


@contextlib.contextmanager
def profiled() -> Iterator[Profile]:
  """Records the search's solves and steps while the block runs."""
  prof = Profile()
  saved = []
  for module, name, step in _STEPS:
    saved.append((module, name, getattr(module, name)))
    setattr(module, name, _step_spy(prof, getattr(module, name), step))
  saved.append((modulo_model, "_solve_once", modulo_model._solve_once))  # pylint: disable=protected-access
  modulo_model._solve_once = _solve_spy(prof, modulo_model._solve_once)  # pylint: disable=protected-access
  try:
    yield prof
  finally:
    for module, name, fn in reversed(saved):
      setattr(module, name, fn)


def _step_spy(prof: Profile, fn, step: str):
  """``fn`` charging its CPU seconds to ``step`` (outermost call only)."""

  def spy(*args, **kwargs):
    outer, prof._step = prof._step, step  # pylint: disable=protected-access
    cpu = time.process_time()
    try:
      return fn(*args, **kwargs)
    finally:
      prof._step = outer  # pylint: disable=protected-access
      if outer != step:
        prof.step_cpu_s[step] = (prof.step_cpu_s.get(step, 0.0)
                                 + time.process_time() - cpu)
  return spy


def _solve_spy(prof: Profile, fn):
  """``modulo_model._solve_once`` recording each solve in ``prof``."""

  def spy(graph, period, memory_limit, **kwargs):
    cpu = time.process_time()
    sol = fn(graph, period, memory_limit, **kwargs)
    prof.solves.append({
        "step": prof._step, "graph": graph.name, "period": period,  # pylint: disable=protected-access
        "memory_limit": memory_limit,
        "objective": kwargs.get("objective"),
        "linearization_level": kwargs.get("linearization_level"),
        "pooled": bool(kwargs.get("pooled_devices")),
        "budget_det_s": round(kwargs.get("time_limit_s", 0.0), 3),
        "status": sol.status, "det_s": round(sol.work, 3),
        "cpu_s": round(time.process_time() - cpu, 3)})
    return sol
  return spy
