"""Automatic cut: split an unmarked step function into forward blocks by cost.

When ``fn`` has no ``tj.boundary`` (or the user asks for ``cut="auto"``),
:func:`cut_to` cuts the traced jaxpr into the number of forward blocks the
placement needs and returns a :class:`~passes.tracing.Traced` with
boundary equations inserted, so ``partition.partition`` works unchanged.

Candidate cut points are the positions between the *units* of the traced
jaxpr after nested ``jax.jit`` / closed calls are inlined
(``compat.flatten_jaxpr``): a unit is a top-level equation (cond, while,
remat and custom_jvp/vjp stay single equations), except that every iteration
of a top-level ``lax.scan`` is its own unit (``passes.scan_split``: a layer
stack scanned over stacked parameters is cut like unrolled layers; the scan
becomes sub-scans over slices of the stacked leaves). Position ``p``
(``1 <= p < n``) starts a new block at unit ``p``. Each unit has a cost
``c_i`` (seconds; measured by timing groups of equations, or a roofline
estimate, see ``passes.autocut_cost``; an iteration of a scan costs
``1 / length`` of the scan), a block's cost is ``w_k * sum(c_i)`` over its
units (``w_k``: optional per-block weight, e.g. ``1 / devices`` for a
block shared by several devices), and the bytes *live* at position ``p`` are
those of values produced by equations before ``p`` and read by equations at
or after ``p`` or returned (parameters, batch leaves and closed-over
constants are excluded: every block reads those directly).

The cut is the optimum of an exact dynamic programme over cut points
(``O(K n^2)`` for ``K`` blocks and ``n`` equations):

1. ``C* = min over cuts of max_k w_k * cost(block k)`` (every block
   non-empty);
2. among the cuts whose busiest block costs at most
   ``C* * (1 + tolerance)`` (and, when the function has a scanned stack,
   whose lightest block costs at least ``(1 - tolerance)`` times the best
   lightest block within that bound: whole layers are balanced first, no
   block is left near-empty), the one minimising, lexicographically,
   ``(sum over cuts of live bytes, busiest block cost)``.

With ``tolerance=0`` this is the lexicographic optimum of (busiest block
cost, total bytes crossing cuts). The default tolerance (3%) lets the cut
move to a layer boundary where a few bytes are live instead of splitting a
layer in the middle for a 1% better balance.
"""

from __future__ import annotations

import dataclasses
import difflib
import time
import weakref
from collections.abc import Callable, Sequence
from typing import Any

import jax
import numpy as np

from tessel_jax import compat

from . import autocut_accum, autocut_cost, scan_split
from . import param_only as _param_only
from .cut_dp import DEFAULT_TOLERANCE, block_costs, optimal_cuts
from .errors import fail
from .tracing import Traced, trace

CUT_MODES = (None, "auto", "markers")


@dataclasses.dataclass(frozen=True)
class AutoCut:
  """How a traced function was cut (see :func:`cut_info`).

  Attributes:
    positions: Unit indices (of the flattened jaxpr's units, one per
      equation or scan iteration) starting blocks
      ``1..K-1``.
    structure: Primitive names of the flattened jaxpr's equations (a re-trace
      must match them to reuse the cut).
    block_costs: Cost of each block (seconds, weights applied).
    cut_bytes: Bytes live at each cut.
    best_max_cost: ``C*``, the smallest possible busiest-block cost.
    tolerance: Relative slack on ``C*`` spent to save bytes.
    cost_source: ``"measured"``, ``"analytic"`` or ``"given"``.
    eqn_costs: Cost of each unit.
    seconds: Wall time of the cut (costing included).
  """

  positions: tuple[int, ...]
  structure: tuple[str, ...]
  block_costs: tuple[float, ...]
  cut_bytes: tuple[int, ...]
  best_max_cost: float
  tolerance: float
  cost_source: str
  eqn_costs: tuple[float, ...]
  seconds: float

  @property
  def num_blocks(self) -> int:
    return len(self.positions) + 1

  @property
  def max_cost(self) -> float:
    return max(self.block_costs)

  def describe(self) -> list[str]:
    """One line per block: equations, cost and bytes sent on."""
    bounds = (0,) + self.positions + (len(self.structure),)
    total = sum(self.block_costs) or 1.0
    lines = []
    for k, (a, b) in enumerate(zip(bounds, bounds[1:])):
      sent = (f", {self.cut_bytes[k]} B live after" if k < len(self.cut_bytes)
              else "")
      lines.append(f"F{k}: eqns [{a}, {b}) cost {self.block_costs[k]:.3g}"
                   f" ({100 * self.block_costs[k] / total:.0f}%){sent}")
    return lines


_INFO: "weakref.WeakKeyDictionary[Traced, AutoCut]" = (
    weakref.WeakKeyDictionary())


def cut_info(traced: Traced) -> AutoCut | None:
  """The :class:`AutoCut` behind a Traced returned by :func:`cut_to`."""
  return _INFO.get(traced)


# --- liveness ----------------------------------------------------------------


def live_bytes(closed_jaxpr: Any) -> np.ndarray:
  """Bytes live at every position ``0..n`` of the top-level equations.

  Position ``p`` sits before equation ``p``. A value counts at ``p`` when an
  equation before ``p`` produces it and an equation at or after ``p`` reads
  it (or the function returns it). Inputs and constants never count.
  """
  jaxpr = closed_jaxpr.jaxpr
  eqns = jaxpr.eqns
  n = len(eqns)
  defined: dict[Any, int] = {}
  for i, eqn in enumerate(eqns):
    for v in eqn.outvars:
      if not compat.is_dropvar(v):
        defined[v] = i
  last: dict[Any, int] = {}
  for i, eqn in enumerate(eqns):
    for v in eqn.invars:
      if not compat.is_literal(v) and v in defined:
        last[v] = max(last.get(v, -1), i)
  for v in jaxpr.outvars:
    if not compat.is_literal(v) and v in defined:
      last[v] = n
  diff = np.zeros(n + 2, dtype=np.int64)
  for v, j in last.items():
    i = defined[v]
    if j > i:  # live at positions i+1 .. j
      size = autocut_cost.nbytes(v.aval)
      diff[i + 1] += size
      diff[j + 1] -= size
  return np.cumsum(diff)[:n + 1]


# --- costs -------------------------------------------------------------------


def eqn_costs(closed_jaxpr: Any, *, cost: Any = "measured", train: bool = True,
              device: Any | None = None, cache: Any = None,
              num_params: int | None = None,
              conv_forms: bool = False,
              accumulation: bool = False) -> tuple[np.ndarray, str]:
  """Per-equation costs of the top-level equations and their source.

  With ``num_params`` (the jaxpr's first ``num_params`` inputs are the
  parameters), ``"measured"`` and ``"analytic"`` price the equations as the
  placed program runs them per micro-batch: parameter-only work the
  lowering hoists out of the ticks (``passes.param_only.find``, e.g. the
  slices of dead convolution taps) runs once per step and costs 0 here, and
  the timed groups read its outputs as inputs (see
  ``autocut_cost.measured_costs``'s ``per_step``). ``"measured"`` times
  its groups as the ticks run kernels (``passes.autocut_ticks``: in a
  branch, the group's own parameter-only work hoisted too, convolutions
  in XLA:CPU's canonical order with ``conv_forms``).

  Args:
    closed_jaxpr: The (flattened) traced function.
    cost: ``"measured"`` (timed groups), ``"analytic"`` (roofline), a
      sequence of ``n`` numbers, or ``callable(closed_jaxpr) -> n numbers``.
    train: Cost forward + backward.
    device: Where to measure.
    cache: ``cost.cache.ProfileCache`` for measured group timings.
    num_params: Parameter inputs (None: price every equation per
      micro-batch).
    conv_forms: The kernels bind convolutions through
      ``passes.conv_forms`` (``Switches.conv_forms`` on a CPU mesh).
    accumulation: With ``train`` and ``num_params``, also price the
      parameter-gradient adds each micro-batch makes into the accumulators
      (``passes.autocut_accum``: measured add rate with ``"measured"``,
      the roofline's bandwidth with ``"analytic"``).
  """
  costs, source = _eqn_costs(closed_jaxpr, cost=cost, train=train,
                             device=device, cache=cache,
                             num_params=num_params, conv_forms=conv_forms)
  if accumulation and train and num_params and source != "given":
    nbytes = autocut_accum.grad_bytes(closed_jaxpr, num_params)
    bw = (None if source == "measured" else autocut_cost.ROOFLINE.get(
        autocut_cost.platform_of(device), autocut_cost.ROOFLINE["cpu"])[1])
    costs = costs + autocut_accum.seconds(nbytes, device, bandwidth=bw)
  return costs, source


def _eqn_costs(closed_jaxpr: Any, *, cost: Any, train: bool,
               device: Any | None, cache: Any, num_params: int | None,
               conv_forms: bool) -> tuple[np.ndarray, str]:
  """:func:`eqn_costs` without the accumulation."""
  eqns = closed_jaxpr.jaxpr.eqns
  if isinstance(cost, str):
    platform = autocut_cost.platform_of(device)
    est = autocut_cost.roofline_seconds(autocut_cost.analytic_costs(eqns),
                                        train=train, platform=platform)
    per_step = hoisted_eqns(closed_jaxpr, num_params)
    if cost == "analytic":
      return np.where(per_step, 0.0, est), "analytic"
    if cost == "measured":
      m = autocut_cost.measured_costs(closed_jaxpr, train=train,
                                      device=device, estimate=est,
                                      cache=cache, per_step=per_step,
                                      ticks=True, conv_forms=conv_forms,
                                      num_params=num_params or 0)
      return m.seconds, "measured"
    raise ValueError(f"cost must be 'measured', 'analytic', a sequence or a"
                     f" callable, got {cost!r}")
  values = cost(closed_jaxpr) if callable(cost) else cost
  arr = np.asarray(values, dtype=float)
  if arr.shape != (len(eqns),):
    raise ValueError(f"{arr.shape[0] if arr.ndim else 0} costs given for"
                     f" {len(eqns)} equations")
  return arr, "given"


def hoisted_eqns(closed_jaxpr: Any, num_params: int | None) -> np.ndarray:
  """Per top-level equation, True when it is parameter-only work the
  lowering computes once per step (``passes.param_only.find`` on the
  function's first ``num_params`` inputs); all False when ``num_params``
  is None."""
  eqns = closed_jaxpr.jaxpr.eqns
  if not num_params:
    return np.zeros(len(eqns), bool)
  found = _param_only.find(closed_jaxpr,
                           closed_jaxpr.jaxpr.invars[:num_params])
  prelude = {id(e) for e in found.prelude}
  return np.array([id(e) in prelude for e in eqns], dtype=bool)


# --- the api entry point -----------------------------------------------------


def _count_problem(have: int, want: int, what: str) -> str:
  diff = want - have
  change = (f"add {diff} tj.boundary call{'s' if diff > 1 else ''}" if diff > 0
            else f"remove {-diff} tj.boundary call{'s' if diff < -1 else ''}")
  return (f"the function has {have} blocks ({have - 1} tj.boundary calls) but"
          f" {what} needs {want} forward blocks; {change}, remove every"
          f" tj.boundary to let tessel_jax cut the function by cost, or pass"
          f" cut='auto' to ignore the markers")


def cut_to(traced: Traced, num_blocks: int, *, fn_name: str | None = None,
           cut: str | None = None, like: Traced | None = None,
           cost: Any = "measured", train: bool = True,
           weights: Sequence[float] | None = None,
           tolerance: float = DEFAULT_TOLERANCE, device: Any | None = None,
           what: str = "the placement", split_leaves: bool = False,
           cache: Any = None, hoist: bool = True,
           conv_forms: bool = False, accumulation: bool = False) -> Traced:
  """The traced function with exactly ``num_blocks`` blocks.

  * ``cut="markers"``: the user's ``tj.boundary`` markers must make
    ``num_blocks`` blocks; ``traced`` is returned as is.
  * ``cut="auto"``: markers (if any) are dropped and the function is cut by
    cost (module docstring).
  * ``cut=None``: markers when there are any, else auto.

  Args:
    traced: From ``tracing.trace``.
    num_blocks: Forward blocks the placement needs.
    fn_name: Name for messages (default ``traced.fn_name``).
    cut: ``None``, ``"auto"`` or ``"markers"``.
    like: A Traced returned by an earlier ``cut_to`` of the same function
      (traced at another batch size): reuse its cut, by equation index,
      after checking the equation structure matches. No costing is done.
    cost: ``"measured"``, ``"analytic"``, per-equation numbers or a callable
      (see :func:`eqn_costs`).
    train: Cost forward + backward (training) or forward only.
    weights: Per-block cost multipliers (e.g. ``1 / len(devices)``).
    tolerance: Slack on the best balance spent to cut where fewer bytes are
      live.
    device: Where measured costs are timed (default: the first device).
    what: How messages name the placement, e.g. ``"placement 'vshape'"``.
    split_leaves: Store stacked parameter leaves that sub-scans read in
      slices as one leaf per slice (``scan_split.split_param_leaves``; the
      result's ``leaf_split`` converts at the program's edge). Follows
      ``like`` when given.
    cache: ``cost.cache.ProfileCache`` keeping measured group timings on
      disk (the same cut in the next process).
    hoist: The lowering computes parameter-only work once per step
      (``Switches.hoist`` on and two micro-batches or more,
      ``passes.hoist.hoistable``): price it 0 per micro-batch
      (:func:`eqn_costs`' ``num_params``). False: price it per
      micro-batch, as the kernels then run it at every tick.
    conv_forms: Measured costs time convolutions as ``passes.conv_forms``
      binds them (``Switches.conv_forms`` on a CPU mesh).
    accumulation: Also price each micro-batch's parameter-gradient adds
      (``Switches.cut_accumulation``; :func:`eqn_costs`).

  Returns:
    A Traced with ``num_blocks`` blocks (an auto cut is recorded for
    :func:`cut_info`).

  Raises:
    TesselError: wrong marker count (markers mode, or some markers with
      ``cut=None``), fewer equations than blocks, a re-trace whose structure
      differs from ``like``, or an unknown ``cut``.
  """
  split = split_leaves or (like is not None and like.leaf_split is not None)
  out = _cut_to(traced, num_blocks, fn_name=fn_name, cut=cut, like=like,
                cost=cost, train=train, weights=weights, tolerance=tolerance,
                device=device, what=what, cache=cache, hoist=hoist,
                conv_forms=conv_forms, accumulation=accumulation)
  return _split_leaves(out) if split else out


def _split_leaves(traced: Traced) -> Traced:
  """``traced`` with stacked leaves stored as slices (see cut_to)."""
  closed, split = scan_split.split_param_leaves(
      traced.closed_jaxpr, len(traced.param_avals), traced.param_tree)
  if split is None:
    return traced
  avals = split.avals(traced.param_avals)
  out = dataclasses.replace(
      traced, closed_jaxpr=closed, param_avals=avals, leaf_split=split,
      param_tree=jax.tree_util.tree_structure(tuple(range(len(avals)))))
  info = cut_info(traced)
  if info is not None:
    _INFO[out] = info
  return out


def _cut_to(traced: Traced, num_blocks: int, *, fn_name: str | None,
            cut: str | None, like: Traced | None, cost: Any, train: bool,
            weights: Sequence[float] | None, tolerance: float,
            device: Any | None, what: str, cache: Any = None,
            hoist: bool = True, conv_forms: bool = False,
            accumulation: bool = False) -> Traced:
  """:func:`cut_to` before any leaf split."""
  t0 = time.perf_counter()
  name = fn_name or traced.fn_name
  if cut not in CUT_MODES:
    raise fail(name, f"cut={cut!r}; use 'auto' (cut by cost, ignoring any"
               f" tj.boundary), 'markers' (cut at the tj.boundary calls) or"
               f" None (markers when there are any, else auto)")
  if isinstance(num_blocks, bool) or int(num_blocks) != num_blocks or (
      num_blocks < 1):
    raise fail(name, f"{what} needs {num_blocks!r} forward blocks; need an"
               f" integer >= 1")
  num_blocks = int(num_blocks)
  have = traced.num_blocks
  if cut == "markers" or (cut is None and have > 1):
    if have != num_blocks:
      raise fail(name, _count_problem(have, num_blocks, what))
    return traced
  if cut is None and num_blocks == 1:
    return traced

  flat, sites, units = _prepared(traced)
  structure = scan_split.structure(flat, units)
  n = len(structure)
  if like is not None:
    info = cut_info(like)
    if info is None:
      if like.num_blocks != num_blocks:
        raise fail(name, f"the reference trace has {like.num_blocks} blocks,"
                   f" not {num_blocks}")
      return traced
    return _apply(traced, (flat, sites, units), info, num_blocks, name)

  if n < num_blocks:
    raise fail(
        name,
        f"{what} needs {num_blocks} forward blocks but the function has only"
        f" {n} top-level operations to cut between (a cond, while or remat"
        f" counts as one, a scan one per iteration); mark the blocks with"
        f" tj.boundary, or pick a placement with fewer blocks")
  eqn_cost, source = eqn_costs(flat, cost=cost, train=train, device=device,
                               cache=cache,
                               num_params=(len(traced.param_avals) if hoist
                                           else None),
                               conv_forms=conv_forms,
                               accumulation=accumulation)
  costs = scan_split.unit_costs(eqn_cost, units, sites)
  live = scan_split.unit_live(live_bytes(flat), flat, units, sites)
  positions, best = optimal_cuts(costs, live, num_blocks, tolerance=tolerance,
                                 weights=weights, floor=bool(sites))
  info = AutoCut(
      positions=positions, structure=structure,
      block_costs=tuple(float(x) for x in block_costs(costs, positions,
                                                      weights)),
      cut_bytes=tuple(int(live[p]) for p in positions),
      best_max_cost=best, tolerance=float(tolerance), cost_source=source,
      eqn_costs=tuple(float(x) for x in costs),
      seconds=time.perf_counter() - t0)
  closed = scan_split.emit(flat, sites, units, positions)
  out = dataclasses.replace(traced, closed_jaxpr=closed, num_blocks=num_blocks)
  _INFO[out] = info
  return out


def _prepared(traced: Traced) -> tuple[Any, dict[int, Any], tuple[Any, ...]]:
  """``(flat, scan sites, units)``: the flattened jaxpr (jit calls inlined,
  boundaries dropped, checkpoints holding scans hoisted) and its cuttable
  units (one per equation, one per iteration of a top-level scan)."""
  flat = scan_split.hoist_remat_scans(flatten(traced))
  sites = scan_split.sites(flat, len(traced.param_avals))
  return flat, sites, scan_split.units(flat, sites)


def _apply(traced: Traced, prepared: tuple[Any, Any, Any], info: AutoCut,
           num_blocks: int, name: str) -> Traced:
  """``traced`` (flattened as ``flat``) cut where ``info`` says.

  Equal structures reuse the positions. Otherwise (a re-trace at another
  batch size where, e.g., a size-1 batch adds squeezes) the two equation
  sequences are aligned (longest matching runs of primitives) and every cut
  is moved to the matching equation; a cut whose neighbours do not match
  raises.
  """
  flat, sites, units = prepared
  structure = scan_split.structure(flat, units)
  if info.num_blocks != num_blocks:
    raise fail(name, f"the reference cut has {info.num_blocks} blocks, not"
               f" {num_blocks}")
  positions = _map_positions(info.structure, structure, info.positions)
  if positions is None:
    raise fail(
        name,
        f"the function was cut automatically on one set of input shapes, but"
        f" traced again on other shapes (e.g. the per-device rows of a block"
        f" shared by several devices) its equations around a cut differ"
        f" ({len(info.structure)} vs {len(structure)} equations); make the"
        f" function's operations independent of the batch size, or mark the"
        f" blocks with tj.boundary")
  closed = scan_split.emit(flat, sites, units, positions)
  out = dataclasses.replace(traced, closed_jaxpr=closed, num_blocks=num_blocks)
  _INFO[out] = info
  return out


def _map_positions(old: Sequence[str], new: Sequence[str],
                   positions: Sequence[int]) -> tuple[int, ...] | None:
  """Cut positions of ``old`` moved to the aligned places in ``new``."""
  if tuple(old) == tuple(new):
    return tuple(positions)
  matcher = difflib.SequenceMatcher(None, list(old), list(new),
                                    autojunk=False)
  equal = [(i1, i2, j1) for tag, i1, i2, j1, _ in matcher.get_opcodes()
           if tag == "equal"]
  out = []
  for p in positions:
    # Equation p starts the block and must match; so must equation p - 1.
    hit = next(((i1, j1) for i1, i2, j1 in equal if i1 <= p < i2), None)
    prev = any(i1 <= p - 1 < i2 for i1, i2, _ in equal)
    if hit is None or not prev:
      return None
    out.append(hit[1] + p - hit[0])
  if any(b <= a for a, b in zip([0] + out, out + [len(new)])):
    return None
  return tuple(out)


def with_cut(fn: Callable[[Any, Any], Any], params: Any, microbatch: Any,
             num_blocks: int, *, fn_name: str | None = None,
             **kwargs: Any) -> Callable[[Any, Any], Any]:
  """``fn`` with ``tj.boundary`` markers where the automatic cut puts them.

  The cut is chosen once, on ``fn`` traced at ``params`` / ``microbatch``
  (arrays or ShapeDtypeStructs); the returned function re-traces ``fn`` at
  whatever shapes it is called with, checks the equation structure matches
  and evaluates it with the markers inserted (same values as ``fn``). Pass
  it to ``tj.schedule`` like a hand-marked function::

      marked = autocut.with_cut(loss_fn, params, microbatch, 4)
      step = tj.schedule(marked, mesh=mesh, placement="vshape", ...)

  Args:
    fn: ``fn(params, microbatch)``.
    params: Parameters (arrays or ShapeDtypeStructs).
    microbatch: One micro-batch.
    num_blocks: Forward blocks.
    fn_name: Name for messages.
    **kwargs: Passed to :func:`cut_to` (``cost``, ``train``, ``weights``,
      ``tolerance``, ``device``).

  Returns:
    The marked function; its ``autocut`` attribute is the :class:`AutoCut`.
  """
  name = fn_name or getattr(fn, "__name__", None) or type(fn).__name__
  ref = cut_to(trace(fn, name, params, microbatch), num_blocks, fn_name=name,
               cut="auto", **kwargs)

  def marked(p: Any, b: Any) -> Any:
    traced = trace(fn, name, p, b)
    cut = _apply(traced, _prepared(traced), cut_info(ref), num_blocks, name)
    leaves = list(jax.tree_util.tree_leaves(p)) + list(
        jax.tree_util.tree_leaves(b))
    outs = compat.eval_closed(cut.closed_jaxpr, leaves)
    return jax.tree_util.tree_unflatten(cut.out_tree, outs)

  marked.__name__ = name
  marked.__qualname__ = name
  marked.__doc__ = fn.__doc__
  marked.autocut = cut_info(ref)  # type: ignore[attr-defined]
  return marked


def flatten(traced: Traced) -> Any:
  """The flattened jaxpr whose equation indices :class:`AutoCut` uses."""
  return compat.flatten_jaxpr(traced.closed_jaxpr, drop_boundaries=True)


__all__ = ["AutoCut", "CUT_MODES", "cut_info", "cut_to", "eqn_costs",
           "flatten", "hoisted_eqns", "live_bytes", "with_cut"]

