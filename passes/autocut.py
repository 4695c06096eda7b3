"""Automatic cut: split an unmarked step function into forward blocks by cost.

When ``fn`` has no ``tj.boundary`` (or the user asks for ``cut="auto"``),
:func:`cut_to` cuts the traced jaxpr into the number of forward blocks the
placement needs and returns a :class:`~passes.partition.Traced` with
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
import itertools
import time
import weakref
from collections.abc import Callable, Sequence
from typing import Any

import jax
import numpy as np

from tessel_jax import compat

from . import autocut_cost, scan_split
from .errors import fail
from .partition import Traced

CUT_MODES = (None, "auto", "markers")
_CHUNK = 256  # DP rows per vectorised step
DEFAULT_TOLERANCE = 0.03


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


# --- the dynamic programme ---------------------------------------------------


def _weights(weights: Sequence[float] | None, num_blocks: int) -> np.ndarray:
  if weights is None:
    return np.ones(num_blocks)
  w = np.asarray(weights, dtype=float)
  if w.shape != (num_blocks,) or np.any(w <= 0):
    raise ValueError(f"weights must be {num_blocks} positive numbers, got"
                     f" {list(weights)}")
  return w


def _check(costs: np.ndarray, num_blocks: int) -> None:
  if num_blocks < 1:
    raise ValueError(f"num_blocks must be >= 1, got {num_blocks}")
  if len(costs) < num_blocks:
    raise ValueError(f"{len(costs)} equations cannot make {num_blocks}"
                     f" non-empty blocks")
  if np.any(costs < 0) or not np.all(np.isfinite(costs)):
    raise ValueError("equation costs must be finite and >= 0")


def block_costs(costs: Sequence[float], positions: Sequence[int],
                weights: Sequence[float] | None = None) -> np.ndarray:
  """Per-block cost of the cut at ``positions``."""
  c = np.asarray(costs, dtype=float)
  bounds = [0, *positions, len(c)]
  w = _weights(weights, len(bounds) - 1)
  return np.array([w[k] * c[a:b].sum()
                   for k, (a, b) in enumerate(zip(bounds, bounds[1:]))])


def min_max_cost(costs: Sequence[float], num_blocks: int,
                 weights: Sequence[float] | None = None) -> float:
  """``C*``: the smallest busiest-block cost over all contiguous cuts."""
  c = np.asarray(costs, dtype=float)
  _check(c, num_blocks)
  w = _weights(weights, num_blocks)
  n = len(c)
  s = np.concatenate([[0.0], np.cumsum(c)])
  # f[p]: best busiest cost covering equations [0, p) with k blocks.
  f = np.full(n + 1, np.inf)
  f[1:] = w[0] * s[1:]
  q = np.arange(n + 1)
  for k in range(1, num_blocks):
    g = np.full(n + 1, np.inf)
    for lo in range(k + 1, n + 1, _CHUNK):
      p = np.arange(lo, min(n + 1, lo + _CHUNK))
      seg = w[k] * (s[p][:, None] - s[None, :])
      cand = np.where(q[None, :] < p[:, None], np.maximum(f[None, :], seg),
                      np.inf)
      g[p] = cand.min(axis=1)
    f = g
  return float(f[n])


def max_min_cost(costs: Sequence[float], num_blocks: int, bound: float,
                 weights: Sequence[float] | None = None) -> float:
  """The largest lightest-block cost over the cuts whose every block costs
  at most ``bound`` (``-inf`` when there is none)."""
  c = np.asarray(costs, dtype=float)
  _check(c, num_blocks)
  w = _weights(weights, num_blocks)
  n = len(c)
  s = np.concatenate([[0.0], np.cumsum(c)])
  # f[p]: best lightest-block cost covering [0, p) with k blocks.
  f = np.where(w[0] * s <= bound, w[0] * s, -np.inf)
  f[0] = -np.inf
  q = np.arange(n + 1)
  for k in range(1, num_blocks):
    g = np.full(n + 1, -np.inf)
    for lo in range(k + 1, n + 1, _CHUNK):
      p = np.arange(lo, min(n + 1, lo + _CHUNK))
      seg = w[k] * (s[p][:, None] - s[None, :])
      ok = (q[None, :] < p[:, None]) & np.isfinite(f)[None, :] & (seg <= bound)
      g[p] = np.where(ok, np.minimum(f[None, :], seg), -np.inf).max(axis=1)
    f = g
  return float(f[n])


def optimal_cuts(costs: Sequence[float], live: Sequence[float],
                 num_blocks: int, *, tolerance: float = DEFAULT_TOLERANCE,
                 weights: Sequence[float] | None = None,
                 floor: bool = False) -> tuple[tuple[int, ...], float]:
  """The DP cut: balance first, then fewest live bytes within ``tolerance``.

  Args:
    costs: Per-equation cost (``n`` numbers >= 0).
    live: Bytes live at each position ``0..n`` (only ``1..n-1`` are used).
    num_blocks: ``K``.
    tolerance: Relative slack on ``C*`` (see the module docstring).
    weights: Per-block cost multipliers (default 1).
    floor: Balance from below too: among the cuts within the bound, only
      those whose lightest block costs at least ``(1 - tolerance)`` times
      the best possible lightest block (:func:`max_min_cost`) count, so no
      block is left near-empty while another holds several layers (used
      for scanned stacks, whose iterations are many equal units).

  Returns:
    ``(positions, C*)``: the ``K - 1`` positions starting blocks ``1..K-1``
    and the optimal busiest-block cost.
  """
  c = np.asarray(costs, dtype=float)
  _check(c, num_blocks)
  if tolerance < 0:
    raise ValueError(f"tolerance must be >= 0, got {tolerance}")
  w = _weights(weights, num_blocks)
  live_b = np.asarray(live, dtype=float)
  n = len(c)
  best = min_max_cost(c, num_blocks, w)
  if num_blocks == 1:
    return (), best
  s = np.concatenate([[0.0], np.cumsum(c)])
  eps = 1e-12 * max(1.0, abs(s[-1]))
  bound = best * (1.0 + tolerance) + eps
  lower = -np.inf
  if floor:
    lower = max_min_cost(c, num_blocks, bound, w) * (1.0 - tolerance) - eps
  # Layer k: for every p, the lexicographic best (bytes, busiest) covering
  # [0, p) with k+1 blocks, each within the bound; parent for backtracking.
  by = np.where((w[0] * s <= bound) & (w[0] * s >= lower), 0.0, np.inf)
  by[0] = np.inf
  mx = np.where(np.isfinite(by), w[0] * s, np.inf)
  parents = []
  q = np.arange(n + 1)
  for k in range(1, num_blocks):
    nby = np.full(n + 1, np.inf)
    nmx = np.full(n + 1, np.inf)
    par = np.full(n + 1, -1, dtype=np.int64)
    for lo in range(k + 1, n + 1, _CHUNK):
      p = np.arange(lo, min(n + 1, lo + _CHUNK))
      seg = w[k] * (s[p][:, None] - s[None, :])
      ok = ((q[None, :] < p[:, None]) & np.isfinite(by)[None, :]
            & (seg <= bound) & (seg >= lower))
      cand_b = np.where(ok, (by + live_b)[None, :], np.inf)
      cand_m = np.where(ok, np.maximum(mx[None, :], seg), np.inf)
      low = cand_b.min(axis=1)
      j = np.argmin(np.where(cand_b == low[:, None], cand_m, np.inf), axis=1)
      rows = np.arange(len(p))
      found = np.isfinite(low)
      nby[p] = np.where(found, low, np.inf)
      nmx[p] = np.where(found, cand_m[rows, j], np.inf)
      par[p] = np.where(found, j, -1)
    by, mx = nby, nmx
    parents.append(par)
  positions = []
  p = n
  for par in reversed(parents):
    p = int(par[p])
    positions.append(p)
  return tuple(reversed(positions)), best


def brute_force_cuts(costs: Sequence[float], num_blocks: int,
                     weights: Sequence[float] | None = None,
                     candidates: Sequence[int] | None = None
                     ) -> tuple[tuple[int, ...], float]:
  """Every contiguous cut enumerated: the best busiest-block cost.

  For checks only (exponential). ``candidates``: allowed positions (default
  ``1..n-1``).
  """
  c = np.asarray(costs, dtype=float)
  _check(c, num_blocks)
  n = len(c)
  s = np.concatenate([[0.0], np.cumsum(c)])
  w = _weights(weights, num_blocks)
  cands = sorted(set(candidates)) if candidates is not None else range(1, n)
  best, best_pos = np.inf, ()
  for pos in itertools.combinations(cands, num_blocks - 1):
    bounds = (0,) + pos + (n,)
    worst = max(w[k] * (s[b] - s[a])
                for k, (a, b) in enumerate(zip(bounds, bounds[1:])))
    if worst < best:
      best, best_pos = worst, pos
  return best_pos, float(best)


# --- costs -------------------------------------------------------------------


def eqn_costs(closed_jaxpr: Any, *, cost: Any = "measured", train: bool = True,
              device: Any | None = None,
              cache: Any = None) -> tuple[np.ndarray, str]:
  """Per-equation costs of the top-level equations and their source.

  Args:
    closed_jaxpr: The (flattened) traced function.
    cost: ``"measured"`` (timed groups), ``"analytic"`` (roofline), a
      sequence of ``n`` numbers, or ``callable(closed_jaxpr) -> n numbers``.
    train: Cost forward + backward.
    device: Where to measure.
    cache: ``cost.cache.ProfileCache`` for measured group timings.
  """
  eqns = closed_jaxpr.jaxpr.eqns
  if isinstance(cost, str):
    platform = autocut_cost.platform_of(device)
    est = autocut_cost.roofline_seconds(autocut_cost.analytic_costs(eqns),
                                        train=train, platform=platform)
    if cost == "analytic":
      return est, "analytic"
    if cost == "measured":
      m = autocut_cost.measured_costs(closed_jaxpr, train=train,
                                      device=device, estimate=est,
                                      cache=cache)
      return m.seconds, "measured"
    raise ValueError(f"cost must be 'measured', 'analytic', a sequence or a"
                     f" callable, got {cost!r}")
  values = cost(closed_jaxpr) if callable(cost) else cost
  arr = np.asarray(values, dtype=float)
  if arr.shape != (len(eqns),):
    raise ValueError(f"{arr.shape[0] if arr.ndim else 0} costs given for"
                     f" {len(eqns)} equations")
  return arr, "given"


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
           cache: Any = None) -> Traced:
  """The traced function with exactly ``num_blocks`` blocks.

  * ``cut="markers"``: the user's ``tj.boundary`` markers must make
    ``num_blocks`` blocks; ``traced`` is returned as is.
  * ``cut="auto"``: markers (if any) are dropped and the function is cut by
    cost (module docstring).
  * ``cut=None``: markers when there are any, else auto.

  Args:
    traced: From ``partition.trace``.
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
                device=device, what=what, cache=cache)
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
            device: Any | None, what: str, cache: Any = None) -> Traced:
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
                               cache=cache)
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
  from .partition import trace  # pylint: disable=import-outside-toplevel
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


__all__ = ["AutoCut", "CUT_MODES", "DEFAULT_TOLERANCE", "block_costs",
           "brute_force_cuts", "cut_info", "cut_to", "eqn_costs", "flatten",
           "live_bytes", "max_min_cost", "min_max_cost", "optimal_cuts",
           "with_cut"]

