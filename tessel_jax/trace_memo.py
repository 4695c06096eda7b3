"""The user function's traces, remembered per process by (function, avals).

``placement="auto"`` builds one step per placement, width and micro-batch
count, and each traces ``fn`` on its micro-batch (``step_cut.trace``) and
at its split blocks' local rows (``step_cut.local_parts``), though only a
few shapes occur (README GPT, 4 devices: 12 traces of two batch shapes).
:func:`trace` keeps the last :data:`SIZE` traces: the same function on the
same avals, options and trace context gives the same ``Traced`` (a frozen
record; nothing downstream changes it), as ``jax.jit`` caches a trace by
the function's identity. A function that cannot be hashed is traced every
time. ``TESSEL_JAX_TRACE_MEMO=0`` traces every time (the path before
session 43).
"""

from __future__ import annotations

import collections
import os
from collections.abc import Callable
from typing import Any

import jax

from tessel_jax import compat

try:  # installed: passes/ is tessel_jax.passes
  from tessel_jax.passes import tracing as _tracing  # type: ignore
except ImportError:  # run from the repository root
  from passes import tracing as _tracing  # type: ignore

#: Traces kept (most recent first out).
SIZE = 16
#: ``0``: every call traces (the switch's old path).
ENV = "TESSEL_JAX_TRACE_MEMO"

_TRACES: collections.OrderedDict[Any, Any] = collections.OrderedDict()
#: Calls answered from memory / traced (tests count them).
STATS = {"hits": 0, "traced": 0}


def enabled() -> bool:
  """Whether :func:`trace` remembers (:data:`ENV`; on by default)."""
  value = os.environ.get(ENV, "1")
  if value not in ("0", "1"):
    raise ValueError(f"{ENV} must be 0 or 1, got {value!r}")
  return value == "1"


def _avals(tree: Any) -> tuple[Any, tuple[Any, ...]]:
  """``tree``'s structure and its leaves' shapes, dtypes and weak types
  (hashable)."""
  leaves, treedef = jax.tree_util.tree_flatten(tree)
  return treedef, tuple((tuple(x.shape), str(x.dtype),
                         bool(getattr(x, "weak_type", False)))
                        for x in leaves)


def _key(fn: Callable[..., Any], fn_name: str, params: Any, microbatch: Any,
         has_aux: bool, dead_taps: bool) -> Any | None:
  """What decides the trace (None: ``fn`` cannot be hashed)."""
  try:
    hash(fn)
  except TypeError:
    return None
  return (fn, fn_name, _avals(params), _avals(microbatch), bool(has_aux),
          bool(dead_taps), compat.context_mesh(),
          bool(jax.config.jax_enable_x64))


def trace(fn: Callable[..., Any], fn_name: str, params: Any, microbatch: Any,
          has_aux: bool = False, dead_taps: bool = False) -> Any:
  """``passes.tracing.trace(fn, ...)``, remembered (see the module doc);
  a trace that fails raises every time."""
  key = _key(fn, fn_name, params, microbatch, has_aux, dead_taps)
  if key is None or not enabled():
    STATS["traced"] += 1
    return _tracing.trace(fn, fn_name, params, microbatch, has_aux=has_aux,
                          dead_taps=dead_taps)
  hit = _TRACES.get(key)
  if hit is not None:
    _TRACES.move_to_end(key)
    STATS["hits"] += 1
    return hit
  STATS["traced"] += 1
  out = _TRACES[key] = _tracing.trace(fn, fn_name, params, microbatch,
                                      has_aux=has_aux, dead_taps=dead_taps)
  while len(_TRACES) > SIZE:
    _TRACES.popitem(last=False)
  return out


def clear() -> None:
  """Forgets every trace."""
  _TRACES.clear()
