"""The priced plans of this process, shared by every ``tj.frontier``.

``(program key, candidate, screened)`` (:func:`plan_key`) -> ``(PricedPlan,
ScheduledFunction)``. Choosing again for the same function, shapes, mesh
and options (another memory limit, another ``placement="auto"`` step)
reuses them; a new process has the disk caches (kernel measurements,
schedules). A plan's lower bound (:func:`remember_bound`) and a build's
error (:func:`remember_error`) are remembered too. Other modules read the
memo through :func:`entries` (its key layout stays here).
"""

from __future__ import annotations

import collections
import dataclasses
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


def plan_key(program_key: Any, c: Candidate, screen: Any) -> Any:
  """The memo key of ``c``'s price (``screen``: False for a full build,
  else what the screening build was, ``FrontierFunction._screen_tag``);
  None when the program has no key (no memo)."""
  return None if program_key is None else (program_key, c, screen)


def remember_bound(program_key: Any, c: Candidate, ms: float) -> None:
  """Keeps ``c``'s lower bound (ms, before any search)."""
  MEMO[(program_key, c, "bound")] = (ms, None)


def known_bound(program_key: Any, c: Candidate) -> float | None:
  """``c``'s remembered lower bound in ms (None: none)."""
  hit = MEMO.get((program_key, c, "bound"))
  return None if hit is None else hit[0]


def remember_error(key: Any, err: Exception) -> None:
  """Keeps the error the build under ``key`` (:func:`plan_key`) raised."""
  MEMO[(key, "error")] = (err, None)


@dataclasses.dataclass(frozen=True)
class Entry:
  """One priced plan of the memo.

  Attributes:
    program_key: The program's key (``FrontierFunction.program_key``).
    candidate: The plan.
    screen: False for a full build, else the screening build's tag.
    plan: Its price.
    step: Its ``ScheduledFunction``.
  """

  program_key: Any
  candidate: Candidate
  screen: Any
  plan: PricedPlan
  step: Any


def entries(program_key: Any = None) -> list[Entry]:
  """The priced plans of ``program_key`` in this process, oldest first
  (None: of every program; a program without a key has no memo), lower
  bounds and errors left out."""
  out = []
  for k, (plan, step) in list(MEMO.items()):
    if (isinstance(k, tuple) and len(k) == 3 and
        isinstance(k[1], Candidate) and isinstance(plan, PricedPlan) and
        (program_key is None or k[0] == program_key)):
      out.append(Entry(k[0], k[1], k[2], plan, step))
  return out


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
  known = (known_bound(ff._key, c)  # pylint: disable=protected-access
           if ff.prune and ff._key is not None else None)  # pylint: disable=protected-access
  if known is not None:
    ff._check_bound(c, known)  # pylint: disable=protected-access
  failed = MEMO.get((key, "error")) if key is not None else None
  if failed is not None:
    raise failed[0]  # this plan could not be built in this process
  return None
