"""Checks of a scheduled step's options and inputs, each failure a
``TesselError`` naming the function, the problem and the fix.

``check_options`` runs once when ``tj.schedule`` is applied;
``check_leaves`` runs on every build, before anything is traced.
"""

from __future__ import annotations

from typing import Any

import jax
import numpy as np

from tessel_jax import checks as _checks
from tessel_jax import compat
from tessel_jax import ramps as _ramps

try:  # installed: passes/ is tessel_jax.passes
  from tessel_jax.passes import autocut as _autocut  # type: ignore
  from tessel_jax.passes import switches as _switches  # type: ignore
except ImportError:  # run from the repository root
  from passes import autocut as _autocut  # type: ignore
  from passes import switches as _switches  # type: ignore

MODES = ("train", "infer")


def check_options(step: Any) -> None:
  """Refuses a mode, mesh axis, plan, number or ``cut`` that cannot work."""
  fail = step._error  # pylint: disable=protected-access
  if step.mode not in MODES:
    raise fail(f"mode is {step.mode!r}; use 'train' (loss and"
               f" gradients) or 'infer' (outputs)")
  names = tuple(getattr(step.mesh, "axis_names", ()))
  if step.pipe_axis not in names:
    raise fail(
        f"the mesh has axes {names} but no {step.pipe_axis!r} axis to run"
        f" the pipeline on; make the mesh with one, e.g. jax.make_mesh((4,),"
        f" ({step.pipe_axis!r},)), or pass pipe_axis= naming the axis to"
        f" use")
  if step.auto and step.plan is not None:
    raise fail("placement='auto' chooses the schedule too; drop"
               " plan=, or name a placement to lower that plan")
  check_numbers(step)
  if not isinstance(step.has_aux, bool):
    raise fail(f"has_aux must be True or False, got {step.has_aux!r}")
  if step.cut not in _autocut.CUT_MODES:
    raise fail(f"cut={step.cut!r}; use 'auto' (cut by cost, ignoring"
               f" any tj.boundary), 'markers' (cut at the"
               f" tj.boundary calls) or None (markers when there are"
               f" any, else auto)")
  ramps_error = _ramps.check(step.interpret_ramps)
  if ramps_error:
    raise fail(ramps_error)
  if step.fsdp not in ("auto", "per_block", "per_step"):
    raise fail(f"fsdp={step.fsdp!r}; use 'per_block' (FSDP parameters"
               f" gathered at each block's tick, ZeRO-3), 'per_step'"
               f" (gathered once per step) or 'auto' (per block unless the"
               f" plan interprets ticks of FSDP blocks)")
  check_switches(step)


def check_switches(step: Any) -> None:
  """Refuses ``switches`` that are not a ``passes.switches.Switches``, or
  given with ``placement="auto"`` (its candidates lower with the
  library's)."""
  fail = step._error  # pylint: disable=protected-access
  if not isinstance(step.switches, _switches.Switches):
    raise fail(f"switches={step.switches!r}; use"
               f" tessel_jax.passes.switches.Switches(hoist=...,"
               f" straight_order=..., tick_order=...,"
               f" residual_trim=...) or None (the library's)")
  if step.auto and step.switches != _switches.from_env():
    raise fail("switches= applies to a named placement; placement='auto'"
               " lowers its candidates with the library's switches: drop"
               " switches=, or name the placement")


def check_numbers(step: Any) -> None:
  """Type and range checks of the numeric options (``checks``)."""
  fail = step._error  # pylint: disable=protected-access
  n = step.num_microbatches
  if n is None and step.auto:
    n = 1  # placement="auto" tries the counts that divide the batch
  if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n < 1:
    raise fail(f"num_microbatches must be an integer >= 1, got {n!r}"
               + (" (or None with placement='auto')"
                  if not step.auto else ""))
  try:
    _checks.microbatches(n)
    if step.memory_limit is not None:
      _checks.integer(step.memory_limit, "memory_limit", low=0,
                      high=2**62, fix="give bytes per device, or None for"
                      " what the device reports")
    _checks.time_limit(step.solver_time_limit_s, "solver_time_limit_s")
    _checks.integer(step.seed, "seed", low=0, high=2**31 - 1)
    _checks.integer(step.optimizer_slots, "optimizer_slots", low=0,
                    high=64)
    _checks.boolean(step.reprofile, "reprofile")
  except _checks.InputError as err:
    raise fail(str(err)) from None


def check_leaves(step: Any, params: Any, batch: Any) -> None:
  """Refuses leaves ``jax.value_and_grad`` would refuse, naming the path.

  Every leaf of ``params`` and ``batch`` must be an array (anything with a
  ``shape`` and a ``dtype``: jax or numpy arrays, numpy scalars,
  ``jax.ShapeDtypeStruct`` for ``lower``). In training mode parameters
  must be floating point (or complex): ``jax.value_and_grad`` raises for
  integer and boolean inputs, and so does this.
  """
  fail = step._error  # pylint: disable=protected-access
  for what, tree in (("params", params), ("batch", batch)):
    for path, leaf in jax.tree_util.tree_leaves_with_path(tree):
      where = f"{what}{jax.tree_util.keystr(path)}"
      if compat.differentiated(leaf):
        raise fail(_differentiated(step.mode, where))
      if not (hasattr(leaf, "shape") and hasattr(leaf, "dtype")):
        raise fail(
            f"leaf {where} is a {type(leaf).__name__} ({leaf!r:.40}), not"
            f" an array; wrap it with jnp.asarray(...) (or close over it"
            f" in the function if it is a constant)")
      dtype = leaf.dtype
      if (what == "params" and step.mode == "train"
          and not jax.numpy.issubdtype(dtype, jax.numpy.inexact)):
        raise fail(
            f"parameter {where} has dtype {dtype}; jax.value_and_grad"
            f" needs floating-point (or complex) inputs and raises for"
            f" {dtype} too. Cast it (e.g. .astype(jnp.float32)), pass it in"
            f" the batch, or close over it in the function")


def _differentiated(mode: str, where: str) -> str:
  """Why the step cannot be differentiated through, and what to do."""
  if mode == "train":
    return (f"{where} is being differentiated (jax.grad, jax.vjp or jax.jvp"
            f" of a function that calls the step). In mode='train' the step"
            f" already returns jax.value_and_grad of the function: (loss,"
            f" grads). Use the gradients it returns instead of"
            f" differentiating through it; put any extra loss term inside"
            f" the function")
  return (f"{where} is being differentiated (jax.grad, jax.vjp or jax.jvp of"
          f" a function that calls the step). A mode='infer' step runs the"
          f" forward pipeline only and has no derivative; for gradients,"
          f" schedule the loss with mode='train', which returns (loss,"
          f" grads) with the backward blocks scheduled too")
