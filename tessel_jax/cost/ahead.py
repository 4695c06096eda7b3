"""Compile a set of measurement programs together, before any is timed.

A cold profile compiles every kernel and then times it, one after the
other; compiling took 90% of the profile's wall time on the README's GPT
(the kernels run for milliseconds). XLA compiles with the Python lock
released, so two compiles started from two threads overlap on two cores.
Timing must never overlap anything (a kernel is timed by the process's
CPU clock on one core), so :func:`compile_together` returns only when
every compile has finished; the caller then times them one by one.

Threads start with jax's default trace context, so inside a mesh context
(``jax.set_mesh``) the thunks run in the calling thread instead.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
from collections.abc import Callable, Mapping
from typing import Any, Generic, TypeVar

from tessel_jax import compat

K = TypeVar("K")
T = TypeVar("T")

#: Compiles in flight at once. The target machine has 2 cores; one XLA
#: compile already keeps part of a second core busy, so more threads only
#: add memory.
WORKERS = 2


@dataclasses.dataclass(frozen=True)
class Outcome(Generic[T]):
  """What one thunk gave: its value, or the exception it raised."""

  value: Any = None
  error: BaseException | None = None

  def get(self) -> T:
    """The value, or the thunk's exception raised again here (where the
    caller would have met it compiling on its own)."""
    if self.error is not None:
      raise self.error
    return self.value


def compile_together(thunks: Mapping[K, Callable[[], T]],
                     workers: int = WORKERS) -> dict[K, Outcome[T]]:
  """Runs every thunk, ``workers`` at a time, and waits for all of them.

  Args:
    thunks: Key -> a call that builds and compiles one program (it may
      also make the program's example inputs).
    workers: Threads; with one thunk, ``workers <= 1`` or a mesh context
      they run in the calling thread, one after the other.

  Returns:
    Key -> :class:`Outcome`, for every key of ``thunks``.
  """
  if len(thunks) <= 1 or workers <= 1 or not compat.context_mesh().empty:
    return {k: _outcome(f) for k, f in thunks.items()}
  with concurrent.futures.ThreadPoolExecutor(
      max_workers=min(workers, len(thunks)),
      thread_name_prefix="tessel_jax-compile") as pool:
    futures = {k: pool.submit(_outcome, f) for k, f in thunks.items()}
    return {k: fut.result() for k, fut in futures.items()}


def _outcome(thunk: Callable[[], T]) -> Outcome[T]:
  """``thunk()``'s :class:`Outcome` (an ``Exception`` kept, not raised)."""
  try:
    return Outcome(value=thunk())
  except Exception as err:  # pylint: disable=broad-except  (raised on use)
    return Outcome(error=err)
