"""The exact dynamic programme behind ``cut="auto"``: cuts of a cost row.

Pure numbers, no jaxprs: ``costs[i]`` is the cost of unit ``i`` (an equation
or a scan iteration, ``passes.autocut``), ``live[p]`` the bytes live at cut
position ``p``, ``weights[k]`` an optional per-block weight. A cut is the
sorted tuple of positions ``p`` (``1 <= p < n``) where a new block starts.

* :func:`min_max_cost`: ``C*``, the smallest busiest-block cost over all
  contiguous cuts into ``num_blocks`` non-empty blocks (``O(K n^2)``,
  vectorised in chunks of ``_CHUNK`` rows).
* :func:`max_min_cost`: the largest lightest-block cost among the cuts whose
  busiest block costs at most ``bound``.
* :func:`optimal_cuts`: among the cuts within ``tolerance`` of ``C*`` (and,
  with ``floor``, whose lightest block is near the best lightest block), the
  lexicographic minimum of (bytes live across the cuts, busiest block).
* :func:`brute_force_cuts`: every cut tried (tests and benchmarks).
* :func:`block_costs`: the per-block costs of one cut.

``passes.autocut`` applies the chosen cut to a traced jaxpr.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence

import numpy as np

_CHUNK = 256  # DP rows per vectorised step
DEFAULT_TOLERANCE = 0.03


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


__all__ = ["DEFAULT_TOLERANCE", "block_costs", "brute_force_cuts",
           "max_min_cost", "min_max_cost", "optimal_cuts"]
