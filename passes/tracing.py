"""Tracing: a step function on one micro-batch as a checked jaxpr.

``trace`` turns ``fn(params, microbatch)`` into a :class:`Traced` (the
jaxpr on flat leaves and the trees around it) and checks where the
``tj.boundary`` markers sit: at the top level, inside nested ``jax.jit``
calls (inlined) or directly in the body of a top-level ``lax.scan`` (cut
after every iteration, ``passes.scan_split``); anywhere else is an error
naming the enclosing primitive. It also checks that the outputs are arrays
and, with ``has_aux=True``, a ``(loss, aux)`` pair. ``check_divisible``
checks that a whole batch splits into micro-batches.

``passes.partition`` cuts a :class:`Traced` into forward blocks;
``passes.autocut`` inserts boundaries into one by cost.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

import jax
import numpy as np

from tessel_jax import compat

from . import dead_taps as _dead_taps
from . import scan_split
from .errors import TesselError, fail

_JIT_PRIMITIVES = ("pjit", "jit", "closed_call", "core_call")


_PRIMITIVE_WORDS = {
    "cond": "a lax.cond / lax.switch branch",
    "while": "a lax.while_loop / fori_loop body",
    "scan": "a lax.scan (or fori_loop) body",
    "checkpoint": "a jax.checkpoint (remat) function",
    "remat": "a jax.checkpoint (remat) function",
    "custom_jvp_call": "a jax.custom_jvp function",
    "custom_vjp_call": "a jax.custom_vjp function",
    "custom_vjp_call_jaxpr": "a jax.custom_vjp function",
    "shard_map": "a shard_map body",
}


@dataclasses.dataclass(frozen=True, eq=False)
class Traced:
  """A step function traced on one micro-batch.

  Attributes:
    fn_name: Name used in error messages.
    closed_jaxpr: The jaxpr of ``fn(params, microbatch)`` on flat leaves.
    param_tree: Tree structure of ``params``.
    batch_tree: Tree structure of the micro-batch.
    out_tree: Tree structure of the outputs.
    param_avals: Flat parameter shapes.
    batch_avals: Flat micro-batch shapes.
    num_blocks: Top-level boundaries + 1.
    aux_tree: With ``has_aux``: tree structure of ``aux`` (its leaves are
      the last flat outputs); None without.
    primary_tree: With ``has_aux``: tree structure of the loss (training)
      or outputs (inference); None without.
    leaf_split: A ``scan_split.LeafSplit`` when stacked parameter leaves are
      stored as slices (``param_tree``/``param_avals`` then describe the
      stored leaves, a flat tuple); None otherwise.
  """

  fn_name: str
  closed_jaxpr: Any
  param_tree: Any
  batch_tree: Any
  out_tree: Any
  param_avals: tuple[jax.ShapeDtypeStruct, ...]
  batch_avals: tuple[jax.ShapeDtypeStruct, ...]
  num_blocks: int
  aux_tree: Any = None
  primary_tree: Any = None
  leaf_split: Any = None

  @property
  def has_aux(self) -> bool:
    return self.aux_tree is not None

  @property
  def num_aux(self) -> int:
    """Flat aux outputs (the last ones)."""
    return self.aux_tree.num_leaves if self.aux_tree is not None else 0


def _nested_boundaries(jaxpr: Any) -> list[tuple[str, ...]]:
  """Enclosing-primitive paths of every boundary below the top level."""
  return [path for eqn, path in compat.iter_eqns_deep(jaxpr)
          if compat.is_boundary(eqn) and path]


def _describe(primitive: str) -> str:
  return _PRIMITIVE_WORDS.get(primitive, f"a {primitive!r} sub-computation")


def trace(fn: Callable[..., Any], fn_name: str, params: Any,
          microbatch: Any, has_aux: bool = False,
          dead_taps: bool = False) -> Traced:
  """Traces ``fn(params, microbatch)`` and checks the boundary placement.

  Args:
    fn: The step function.
    fn_name: Its name for messages.
    params: Parameter pytree (arrays or ShapeDtypeStructs).
    microbatch: One micro-batch (arrays or ShapeDtypeStructs).
    has_aux: ``fn`` returns ``(loss, aux)`` (``jax.value_and_grad``'s
      convention).
    dead_taps: Slice the convolutions' taps that only read padding off
      their kernels (``passes.dead_taps``).

  Raises:
    TesselError: if a boundary sits inside a cond/while body or another
      higher-order primitive (a boundary directly in the body of a
      top-level scan cuts the scan after every iteration,
      ``scan_split.split_marked``), an output leaf is not an array, or
      with ``has_aux`` the result is not a pair.
  """
  p_leaves, p_tree = jax.tree_util.tree_flatten(params)
  b_leaves, b_tree = jax.tree_util.tree_flatten(microbatch)
  p_avals = tuple(jax.ShapeDtypeStruct(x.shape, x.dtype) for x in p_leaves)
  b_avals = tuple(jax.ShapeDtypeStruct(x.shape, x.dtype) for x in b_leaves)
  n_p = len(p_leaves)
  trees: dict[str, Any] = {}

  def flat_fn(*leaves: Any) -> Any:
    p = jax.tree_util.tree_unflatten(p_tree, leaves[:n_p])
    b = jax.tree_util.tree_unflatten(b_tree, leaves[n_p:])
    out = fn(p, b)
    if has_aux:
      _check_pair(fn_name, out)
      trees["primary"] = jax.tree_util.tree_structure(out[0])
      trees["aux"] = jax.tree_util.tree_structure(out[1])
      _check_arrays(fn_name, out[0], "the first element of fn's result")
      _check_arrays(fn_name, out[1], "aux")
    else:
      _check_arrays(fn_name, out, "fn's result")
    return out

  closed, out_tree = _make_jaxpr(flat_fn, *p_avals, *b_avals)
  nested = _nested_boundaries(closed.jaxpr)
  if nested:
    blocking = [p for p in nested
                if any(name not in _JIT_PRIMITIVES for name in p)]
    if not blocking:
      # Boundaries only inside nested jax.jit calls: inline them.
      closed, out_tree = _make_jaxpr(flat_fn, *p_avals, *b_avals,
                                     inline_jit=True)
      nested = _nested_boundaries(closed.jaxpr)
      blocking = nested
    if blocking and all(p == ("scan",) for p in blocking):
      # Boundaries in the body of a top-level scan: cut after every layer.
      closed = scan_split.split_marked(closed)
      blocking = [p for p in _nested_boundaries(closed.jaxpr)
                  if any(name not in _JIT_PRIMITIVES for name in p)]
    if blocking:
      outer = next(name for name in blocking[0]
                   if name not in _JIT_PRIMITIVES)
      raise fail(
          fn_name,
          f"tj.boundary is called inside {_describe(outer)}; blocks can only"
          " be cut at the top level of the step function or directly in the"
          " body of a top-level lax.scan (which cuts the scanned stack after"
          " every iteration). Move the boundary out of the control-flow"
          " body, or leave the stack unmarked and pass cut='auto' to cut"
          " the scan at iteration boundaries by cost.")
  if dead_taps:
    closed = _dead_taps.rewrite(closed)
  num_blocks = 1 + sum(1 for e in closed.jaxpr.eqns if compat.is_boundary(e))
  return Traced(fn_name=fn_name, closed_jaxpr=closed, param_tree=p_tree,
                batch_tree=b_tree, out_tree=out_tree, param_avals=p_avals,
                batch_avals=b_avals, num_blocks=num_blocks,
                aux_tree=trees.get("aux"), primary_tree=trees.get("primary"))


def _make_jaxpr(flat_fn: Callable[..., Any], *avals: Any,
                inline_jit: bool = False) -> tuple[Any, Any]:
  """``compat.make_jaxpr``; an error raised while tracing is raised again
  without the note JAX adds about its filtered frames."""
  try:
    return compat.make_jaxpr(flat_fn, *avals, inline_jit=inline_jit)
  except TesselError as err:
    raise TesselError(*err.args) from None


def _check_pair(fn_name: str, out: Any) -> None:
  """``has_aux``: the result must be a 2-tuple ``(loss, aux)``."""
  if isinstance(out, tuple) and len(out) == 2:
    return
  if isinstance(out, (tuple, list)):
    what = f"a {type(out).__name__} of length {len(out)}"
  elif hasattr(out, "shape") and hasattr(out, "dtype"):
    what = f"one array of shape {tuple(out.shape)}"
  else:
    what = f"a {type(out).__name__}"
  raise fail(fn_name, f"has_aux=True needs fn to return a pair (loss, aux),"
             f" as jax.value_and_grad(has_aux=True) does; it returned {what}."
             f" Return a tuple (loss, aux), or drop has_aux=True")


def _is_array(x: Any) -> bool:
  return isinstance(x, (jax.Array, np.ndarray, np.generic, bool, int, float,
                        complex))


def _check_arrays(fn_name: str, tree: Any, what: str) -> None:
  """Every leaf of ``tree`` is an array (or a Python number)."""
  for path, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]:
    if not _is_array(leaf):
      where = jax.tree_util.keystr(path) or "(the whole value)"
      raise fail(fn_name, f"{what} must be a pytree of arrays, but its leaf"
                 f" {where} is a {type(leaf).__name__} ({leaf!r:.60}); return"
                 f" arrays only (keep Python values such as strings outside"
                 f" the traced function)")


def check_divisible(fn_name: str, batch_avals: Sequence[Any],
                    num_microbatches: int,
                    paths: Sequence[str] | None = None) -> int:
  """Returns the micro-batch size; raises unless the batch splits evenly.

  Args:
    fn_name: For messages.
    batch_avals: Flat leaves of the whole batch.
    num_microbatches: N.
    paths: Each leaf's path in the batch (``jax.tree_util.keystr``), for
      messages; None: ``leaf <i>``.
  """
  if not batch_avals:
    raise fail(fn_name, "the batch has no array leaves; pass the batch as the"
               " second argument, split along axis 0 into micro-batches")
  names = (list(paths) if paths is not None else
           [f" leaf {i}" for i in range(len(batch_avals))])
  for name, a in zip(names, batch_avals):
    if not a.shape:
      raise fail(fn_name, f"batch{name} is a scalar (shape ()); every batch"
                 f" leaf needs a leading batch axis to split into"
                 f" {num_microbatches} micro-batches. A value shared by"
                 f" every example (a temperature, a step count) belongs"
                 f" outside the batch: close over it in the function, or"
                 f" pass it in params (its gradient is then returned too)")
  sizes: dict[int, list[str]] = {}
  for name, a in zip(names, batch_avals):
    sizes.setdefault(a.shape[0], []).append(name)
  if len(sizes) != 1:
    which = "; ".join(f"{n}: batch{', batch'.join(ls[:3])}"
                      f"{' ...' if len(ls) > 3 else ''}"
                      for n, ls in sorted(sizes.items()))
    raise fail(fn_name, f"batch leaves have different leading sizes"
               f" {sorted(sizes)} ({which}); every leaf must have the"
               f" same batch axis 0: give per-example values one row per"
               f" example, and pass values shared by the whole batch in"
               f" params or close over them")
  size = next(iter(sizes))
  if num_microbatches < 1 or size % num_microbatches:
    raise fail(fn_name, f"the batch has {size} examples along axis 0, which"
               f" does not divide into num_microbatches={num_microbatches};"
               f" pick a divisor of {size} or pad the batch")
  return size // num_microbatches
