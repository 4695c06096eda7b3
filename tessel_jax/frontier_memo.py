"""The priced plans of this process, shared by every ``tj.frontier``.

``(program key, candidate, screened)`` -> ``(PricedPlan,
ScheduledFunction)``. Choosing again for the same function, shapes, mesh
and options (another memory limit, another ``placement="auto"`` step)
reuses them; a new process has the disk caches (kernel measurements,
schedules). A plan's lower bound (``(program key, candidate, "bound")``)
and a build's error (``(key, "error")``) are remembered too.
"""

from __future__ import annotations

import collections
from typing import TYPE_CHECKING, Any

from tessel_jax.frontier_result import Candidate, PricedPlan

if TYPE_CHECKING:
  from tessel_jax.plans import FrontierFunction

MEMO: collections.OrderedDict[Any, tuple[Any, Any]] = (
    collections.OrderedDict())
MEMO_SIZE = 512


def clear() -> None:
  """Forgets the priced plans of this process (the disk caches stay)."""
  MEMO.clear()


def remember(key: Any, plan: PricedPlan, step: Any) -> None:
  """Keeps ``plan`` and its step under ``key`` (the oldest of more than
  :data:`MEMO_SIZE` dropped)."""
  MEMO[key] = (plan, step)
  while len(MEMO) > MEMO_SIZE:
    MEMO.popitem(last=False)


def remembered(ff: FrontierFunction, key: Any, c: Candidate,
               ceiling: bool) -> PricedPlan | None:
  """``c``'s price from :data:`MEMO` (None: build it). Raises
  ``Pruned`` when its remembered lower bound cannot beat ``ff``'s best so
  far, and the remembered error when it could not be built."""
  best = ff._best_ms  # pylint: disable=protected-access
  hit = MEMO.get(key) if key is not None else None
  if hit is not None and hit[0].bound and (
      not ceiling or best is None or hit[0].step < best):
    hit = None  # a lower bound that may win here: priced in full now
  if hit is not None:
    MEMO.move_to_end(key)
    ff.memo_hits += 1
    ff.steps[c] = hit[1]
    return hit[0]
  known = (MEMO.get((ff._key, c, "bound"))  # pylint: disable=protected-access
           if ff.prune and ff._key is not None else None)  # pylint: disable=protected-access
  if known is not None:
    ff._check_bound(c, known[0])  # pylint: disable=protected-access
  failed = MEMO.get((key, "error")) if key is not None else None
  if failed is not None:
    raise failed[0]  # this plan could not be built in this process
  return None


def limited_plans(ff: FrontierFunction, have: set[Candidate]
                  ) -> list[PricedPlan]:
  """The searched plans of ``ff``'s program built in full under some
  memory limit in this process (another ``tj.frontier`` or
  ``placement="auto"`` call), not in ``have``, of ``ff``'s placements and
  micro-batch counts, whose peak fits ``ff.memory_limit`` (None: every
  one).

  A plan searched under a limit fits no limit, and every limit above its
  peak; the search under a limit can find a plan faster than the search
  without one (README GPT, 8 devices, session 33: 39.77 ms at 3.88 MB
  under 4.64 MB, 40.51 ms at 5.08 MB without a limit: each search is cut
  at a CP-SAT budget, and it orders by the quantized period, not the
  replayed step). Lower bounds (``PricedPlan.bound``) are left out. Each
  plan's ``ScheduledFunction`` goes into ``ff.steps``.
  """
  key, limit = ff._key, ff.memory_limit  # pylint: disable=protected-access
  if key is None:
    return []
  out = []
  for k, (plan, step) in list(MEMO.items()):
    if not (isinstance(k, tuple) and len(k) == 3 and k[0] == key and
            k[2] is False and isinstance(k[1], Candidate)):
      continue
    c = k[1]
    if (c.plan is not None or c.memory_limit is None or c in have or
        plan.bound or (limit is not None and plan.peak_bytes > limit) or
        c.placement not in ff.names or
        (ff.microbatches is not None and
         c.microbatches not in ff.microbatches)):
      continue
    ff.steps[c] = step
    out.append(plan)
  return out
