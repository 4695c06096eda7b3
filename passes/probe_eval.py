"""Programs compiled for their values only: probes that evaluate a block
once on example inputs to decide how the block runs (``modes``' sum
ratios, ``shared_aux``' means), never timed.

Their CPU code is built at LLVM's lowest level (:data:`COMPILE_OPTIONS`):
README GPT's blocks compiled in 0.23-0.27 s instead of 0.93-1.13 s
(session 48). They are lowered outside ``jax.ensure_compile_time_eval``,
under which every equation of a block on its constants alone ran eagerly,
each compiled on its own.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import jax

#: XLA options of a probe's program (``Lowered.compile``'s argument).
COMPILE_OPTIONS = {"xla_backend_optimization_level": 0}


def compiled(fn: Callable[..., Any], xs: Sequence[Any]) -> Callable[..., Any]:
  """``fn`` jitted, lowered for ``xs`` and compiled with
  :data:`COMPILE_OPTIONS`: call it on values shaped like ``xs``."""
  return jax.jit(fn).lower(*xs).compile(compiler_options=COMPILE_OPTIONS)


def evaluate(fn: Callable[..., Any], xs: Sequence[Any]) -> Any:
  """``fn(*xs)`` by a program :func:`compiled` for ``xs``."""
  return compiled(fn, xs)(*xs)
