"""Plans searched under another memory limit in this process, offered to
a frontier (``FrontierFunction`` adds them before choosing).

A plan searched under a limit fits no limit, and every limit above its
peak; the search under a limit can find a plan faster than the search
without one (README GPT, 8 devices, session 33: 39.77 ms at 3.88 MB under
4.64 MB, 40.51 ms at 5.08 MB without a limit: each search is cut at a
CP-SAT budget, and it orders by the quantized period, not the replayed
step).

So **a frontier's result depends on what this process priced before**: the
same ``tj.frontier`` or ``placement="auto"`` call may list more plans, and
choose a faster one, after another call of the same program, shapes, mesh
and options under another limit (``frontier_memo``). What it adds is only
ever a full build that fits the frontier's own limit, so the choice can
only get faster, never over the limit; a new process (or
``plans.clear_memo()``) starts from its own searches again.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from tessel_jax import frontier_memo as _frontier_memo
from tessel_jax.frontier_result import Candidate, PricedPlan

if TYPE_CHECKING:
  from tessel_jax.plans import FrontierFunction


def limited_plans(ff: FrontierFunction, have: set[Candidate]
                  ) -> list[PricedPlan]:
  """The searched plans of ``ff``'s program built in full under some
  memory limit in this process (another ``tj.frontier`` or
  ``placement="auto"`` call), not in ``have``, of ``ff``'s placements and
  micro-batch counts, whose peak fits ``ff.memory_limit`` (None: every
  one). Lower bounds (``PricedPlan.bound``) and screened prices are left
  out. Each plan's ``ScheduledFunction`` goes into ``ff.steps``."""
  key, limit = ff._key, ff.memory_limit  # pylint: disable=protected-access
  if key is None:
    return []
  out = []
  for e in _frontier_memo.entries(key):
    c, plan = e.candidate, e.plan
    if (e.screen is not False or c.plan is not None or
        c.memory_limit is None or c in have or plan.bound or
        (limit is not None and plan.peak_bytes > limit) or
        c.placement not in ff.names or
        (ff.microbatches is not None and
         c.microbatches not in ff.microbatches)):
      continue
    ff.steps[c] = e.step
    out.append(plan)
  return out
