"""The input boundary: type and range checks shared by every public entry.

Every number a user hands to tessel_jax (a placement's spans and memory, a
memory limit, a micro-batch count, a time limit, a cached measurement)
passes through one of these functions before any solver or JAX call. They
never coerce silently: integers must be integers (a float with no
fractional part such as ``4.0`` is accepted, ``2.7`` is not), booleans are
not numbers, strings are not numbers, NaN and infinities are refused, and
sizes are bounded by what the search can model (the bounds below; the
message names the bound).

Errors are :class:`InputError` (a ``ValueError``) or the subclass the caller
passes (``PlacementError``, ``ScheduleError``, ...); the message names the
field, the value and the fix. No jax, no ortools here.
"""

from __future__ import annotations

import math
import numbers
from typing import Any

#: Devices on one pipeline axis the search models (placement builders,
#: CP-SAT models and completion grow with it: V-shape on 256 devices took
#: 115 s to search with a 20 s budget on a 2-core machine; 5,000 ran past
#: minutes).
MAX_DEVICES = 256
#: Blocks in one placement.
MAX_BLOCKS = 4096
#: Sum of all spans and delays of a placement handed to the search: bounds
#: the period (the search keeps period-long tables) and every start time.
#: One block's span or one edge's delay is bounded by it too.
MAX_TOTAL_SPAN = 10**7
MAX_SPAN = MAX_TOTAL_SPAN
#: |memory| of one block handed to the search, in the placement's units.
MAX_MEMORY = 10**12
#: |memory| any BlockGraph may hold (what 64-bit integers represent with
#: room for sums; the search's own derived graphs add memory up).
MAX_GRAPH_MEMORY = 2**62
#: A per-device memory limit (CP-SAT works in 64-bit integers; use None for
#: no limit).
MAX_MEMORY_LIMIT = 10**15
#: Micro-batches one ``unroll`` materialises. ``unroll`` builds one Action
#: per block and micro-batch and compacts them: V-shape on 4 devices took
#: 74 s and 1.1 GB for N = 10**5 (800,000 actions) on a 2-core machine.
MAX_MICROBATCHES = 10**5
#: Actions (blocks x micro-batches) one ``unroll`` materialises.
MAX_ACTIONS = 10**6
#: Seconds of a solver time limit (about 11 days).
MAX_TIME_LIMIT_S = 10.0**6

#: Picture formats ``plot.gantt`` writes (matplotlib picks the format from
#: the suffix); runners check ``--plot`` against them before any work.
IMAGE_SUFFIXES = (".png", ".svg", ".pdf", ".jpg", ".jpeg", ".eps", ".ps",
                  ".tif", ".tiff", ".webp")


class InputError(ValueError):
  """A value given to tessel_jax has the wrong type or is out of range.

  The message names the field, the value and how to fix it.
  """


def _raise(error: type[ValueError], where: str, text: str) -> None:
  prefix = f"{where}: " if where else ""
  raise error(prefix + text)


def _is_bool(value: Any) -> bool:
  """True for Python and numpy booleans (numpy 2 names its type ``bool``)."""
  return isinstance(value, bool) or type(value).__name__ in ("bool", "bool_")


def _show(value: Any) -> str:
  text = repr(value)
  return text if len(text) <= 60 else text[:57] + "..."


def is_integer(value: Any) -> bool:
  """True for an int (not a bool) or a finite float with no fraction."""
  if _is_bool(value):
    return False
  if isinstance(value, numbers.Integral):
    return True
  if isinstance(value, numbers.Real):
    f = float(value)
    return math.isfinite(f) and f.is_integer()
  return False


def integer(value: Any, field: str, *, low: int | None = None,
            high: int | None = None, where: str = "", fix: str = "",
            error: type[ValueError] = InputError) -> int:
  """Returns ``value`` as an int, or raises naming ``field``.

  Args:
    value: The value to check.
    field: Its name in messages (e.g. ``"block 3 span"``).
    low: Smallest allowed value (None: no bound).
    high: Largest allowed value (None: no bound); the message states it.
    where: Message prefix naming the entry point (e.g. ``"placement 'p'"``).
    fix: Extra advice appended to the message.
    error: The exception class to raise (a ``ValueError`` subclass).

  Raises:
    error: for a non-integer (2.7, "3", True, NaN, inf, None) or a value
      outside ``[low, high]``.
  """
  tail = f"; {fix}" if fix else ""
  if not is_integer(value):
    kind = "a boolean" if _is_bool(value) else type(value).__name__
    _raise(error, where, f"{field} must be an integer{_range(low, high)},"
           f" got {_show(value)} ({kind}){tail}")
  out = int(value)
  if (low is not None and out < low) or (high is not None and out > high):
    _raise(error, where, f"{field} must be an integer{_range(low, high)},"
           f" got {out}{tail}")
  return out


def real(value: Any, field: str, *, low: float | None = None,
         high: float | None = None, positive: bool = False, where: str = "",
         fix: str = "", error: type[ValueError] = InputError) -> float:
  """Returns ``value`` as a finite float, or raises naming ``field``.

  Args:
    value: The value to check.
    field: Its name in messages.
    low: Smallest allowed value (None: no bound).
    high: Largest allowed value (None: no bound).
    positive: Also refuse 0 (``> 0`` rather than ``>= low``).
    where: Message prefix naming the entry point.
    fix: Extra advice appended to the message.
    error: The exception class to raise.

  Raises:
    error: for a non-number, a boolean, NaN, an infinity or a value out of
      range.
  """
  tail = f"; {fix}" if fix else ""
  if positive and low is None:
    what = "a finite number " + (f"in (0, {high}]" if high is not None
                                 else "> 0")
  else:
    what = "a finite number" + _range(low, high)
  if (_is_bool(value)
      or not isinstance(value, numbers.Real)):
    _raise(error, where, f"{field} must be {what}, got {_show(value)}"
           f" ({type(value).__name__}){tail}")
  out = float(value)
  if (not math.isfinite(out) or (positive and out <= 0)
      or (low is not None and out < low) or (high is not None and out > high)):
    _raise(error, where, f"{field} must be {what}, got {out!r}{tail}")
  return out


def boolean(value: Any, field: str, *, where: str = "",
            error: type[ValueError] = InputError) -> bool:
  """Returns ``value`` if it is a bool (numpy bool too), else raises."""
  if _is_bool(value):
    return bool(value)
  _raise(error, where, f"{field} must be True or False, got {_show(value)}"
         f" ({type(value).__name__})")
  return False  # unreachable


def string(value: Any, field: str, *, where: str = "",
           error: type[ValueError] = InputError) -> str:
  """Returns ``value`` if it is a str, else raises naming ``field``."""
  if not isinstance(value, str):
    _raise(error, where, f"{field} must be a string, got {_show(value)}"
           f" ({type(value).__name__})")
  return value


def sequence(value: Any, field: str, *, where: str = "",
             error: type[ValueError] = InputError) -> list[Any]:
  """Returns ``value`` as a list if it is a list or tuple, else raises."""
  if not isinstance(value, (list, tuple)):
    _raise(error, where, f"{field} must be a list, got {_show(value)}"
           f" ({type(value).__name__})")
  return list(value)


def mapping(value: Any, field: str, *, where: str = "",
            error: type[ValueError] = InputError) -> dict[str, Any]:
  """Returns ``value`` if it is a dict, else raises naming ``field``."""
  if not isinstance(value, dict):
    _raise(error, where, f"{field} must be a JSON object (dict), got"
           f" {_show(value)} ({type(value).__name__})")
  return value


def memory_limit(value: Any, field: str = "memory_limit", *, where: str = "",
                 error: type[ValueError] = InputError) -> int | None:
  """A per-device memory limit: None (no limit) or an int in range."""
  if value is None:
    return None
  return integer(value, field, low=0, high=MAX_MEMORY_LIMIT,
                 where=where, error=error,
                 fix="give an integer in the placement's memory units, or"
                 " None for no limit")


def microbatches(value: Any, *, num_blocks: int = 1, where: str = "",
                 field: str = "num_microbatches",
                 error: type[ValueError] = InputError) -> int:
  """A micro-batch count in ``[1, MAX_MICROBATCHES]`` whose unrolling (one
  action per block and micro-batch) stays within ``MAX_ACTIONS``."""
  high = min(MAX_MICROBATCHES, max(1, MAX_ACTIONS // max(1, num_blocks)))
  return integer(value, field, low=1, high=high, where=where, error=error,
                 fix=f"the unrolled schedule holds one action per block and"
                 f" micro-batch (at most {MAX_ACTIONS} actions); use fewer"
                 f" micro-batches")


def time_limit(value: Any, field: str = "time_limit_s", *, where: str = "",
               error: type[ValueError] = InputError) -> float:
  """A solver time limit: a finite number of seconds in ``(0, 10**6]``."""
  return real(value, field, positive=True, high=MAX_TIME_LIMIT_S,
              where=where, error=error, fix="give the solver's budget in"
              " seconds, e.g. 30")


def _range(low: int | float | None, high: int | float | None) -> str:
  if low is not None and high is not None:
    return f" in [{low}, {high}]"
  if low is not None:
    return f" >= {low}"
  if high is not None:
    return f" <= {high}"
  return ""
