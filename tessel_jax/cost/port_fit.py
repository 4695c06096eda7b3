"""The machine's per-port record fitted on several stand-in programs.

A stand-in program's step, less its serial part, is what the tick model
prices with zero-time kernels (``cost.port_pricing``): the microbenchmark's
ticks (``idle_s``), plus ``per_port_s`` for every port operation on the
replay's critical path (``port_s`` of them: the replay's slope in the
seconds per port) plus ``fixed_s`` seconds for every tick on it
(``tick_s`` ticks: its slope in the seconds every tick pays). One stand-in
gives one equation ``excess_s = per_port_s * port_s + fixed_s * tick_s``;
two of different ports per tick separate the two parts, if they differ
enough: with eqx_mlp's 17 and the CNN's 50 ports per tick, 10% of timing
noise on either moves the fixed part by a factor ~2 (27-59 around 40), and
quiet runs of the zoo fitted 16-66. So :func:`fit` takes the fixed part
from the points only where that band (:func:`tick_ports_band`) is narrow,
else the prior (helper zoo12, session 36).

That matters where programs differ in ports per tick: on 2 CPU devices
(``vshape(2)``, N = 8) eqx_mlp pays 17 port operations per tick, the
batch-norm CNN 46, the transformers 107-172; one stand-in solved with a
fixed per-tick part worth a constant ``ports.TICK_PORTS`` ports priced
eqx_mlp's ticks at a third to a half of its own stand-in's (helper zoo8,
session 32: its steps ran 1.33-1.56x their prediction).

A point (one stand-in, ``port_pricing``) is a dict with ``excess_s``,
``port_s`` and ``tick_s``, and ``standin_s`` and ``serial_s`` (the
weights: every point's relative error counts alike).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

#: Relative timing noise of one point's excess assumed by :func:`fit`: a
#: stand-in's excess over the idle replay, per tick, moved 6-9% between
#: quiet processes (the zoo's two stand-ins, sessions 33-35: the ratio of
#: their per-tick excesses ranged 1.39-1.88 over ten runs).
REL_NOISE = 0.10
#: Widest band (largest over smallest, :func:`tick_ports_band`) of a fixed
#: part that :func:`fit` takes from the points rather than the prior.
MAX_BAND = 2.0


def ports_per_tick(point: dict[str, Any]) -> float:
  """Port operations per tick on the replay's critical path."""
  return float(point["port_s"]) / max(float(point["tick_s"]), 1e-12)


def spread(points: Sequence[dict[str, Any]]) -> float:
  """Largest over smallest ports per tick among ``points`` (1: one)."""
  ppt = [ports_per_tick(p) for p in points]
  return max(ppt) / max(min(ppt), 1e-12)


def _weights(points: Sequence[dict[str, Any]]) -> np.ndarray:
  """1 / the step each point predicts (its relative error counts)."""
  return np.array([1.0 / max(float(p["standin_s"]) - float(p["serial_s"]),
                             1e-9) for p in points])


def _one_part(points: Sequence[dict[str, Any]], tick_ports: float) -> float:
  """Weighted least squares of ``per_port_s`` with every tick worth
  ``tick_ports`` port operations."""
  w = _weights(points)
  x = w * np.array([float(p["port_s"]) + tick_ports * float(p["tick_s"])
                    for p in points])
  y = w * np.array([float(p["excess_s"]) for p in points])
  den = float(x @ x)
  return float(x @ y) / den if den > 0 else 0.0


def _two_parts(points: Sequence[dict[str, Any]],
               scale: Sequence[float] | None = None
               ) -> tuple[float, float]:
  """``(per_port_s, fixed_s)`` of ``points`` by weighted least squares,
  each point's excess times ``scale`` (1: as timed)."""
  w = _weights(points)
  a = w[:, None] * np.array([[float(p["port_s"]), float(p["tick_s"])]
                             for p in points])
  y = w * np.array([float(p["excess_s"]) for p in points])
  if scale is not None:
    y = y * np.asarray(scale, dtype=float)
  (per_port, fixed), *_ = np.linalg.lstsq(a, y, rcond=None)
  return float(per_port), float(fixed)


def tick_ports_band(points: Sequence[dict[str, Any]], rel_noise: float
                    ) -> tuple[float, float]:
  """Smallest and largest fixed part (in port operations per tick) of the
  two-part fit with one point's excess moved by ``+-rel_noise`` in turn:
  how far the timing noise of a stand-in moves it. Where a moved fit has
  no positive per-port part the band is ``(-inf, inf)``.

  Two points of 17 and 50 ports per tick (eqx_mlp and the batch-norm CNN,
  the zoo's record) with a fixed part of 40 give a band of about 27-59 at
  10% noise: their ports per tick differ too little to separate the parts.
  """
  ks = []
  for i in range(len(points)):
    for sign in (1.0, -1.0):
      scale = [1.0] * len(points)
      scale[i] += sign * rel_noise
      per_port, fixed = _two_parts(points, scale)
      if per_port <= 0:
        return -np.inf, np.inf
      ks.append(fixed / per_port)
  return min(ks), max(ks)


def fit(points: Sequence[dict[str, Any]], prior_tick_ports: float,
        min_spread: float, max_ratio: float = 4.0,
        rel_noise: float = REL_NOISE, max_band: float = MAX_BAND
        ) -> tuple[float, float]:
  """``(per_port_s, tick_ports)`` of ``points``: seconds per port
  operation and every tick's fixed cost in port operations.

  Both by weighted least squares where the points determine both: their
  ports per tick span at least ``min_spread`` and the fixed part's band
  under ``rel_noise`` of timing noise (:func:`tick_ports_band`) is
  positive and at most ``max_band`` wide (largest over smallest). Else the
  per-port part alone, every tick worth ``prior_tick_ports``: a fixed part
  the timings cannot pin down is not fitted (session 35, quiet: the zoo's
  two stand-ins, 17 and 50 ports per tick, gave 16 in one run and 66 in
  the next). A fit whose fixed part is negative although its band is
  narrow keeps the per-port part alone (``tick_ports`` 0); one whose
  ``tick_ports`` is more than ``max_ratio`` times off the prior keeps the
  prior (two points timed on a loaded machine gave 474 port operations
  per tick against the six stand-ins' 40).
  """
  if not points:
    raise ValueError("fit() needs at least one stand-in point")
  prior = _one_part(points, prior_tick_ports), prior_tick_ports
  if len(points) < 2 or spread(points) < min_spread:
    return prior
  per_port, fixed = _two_parts(points)
  if per_port <= 0:
    return prior
  lo, hi = tick_ports_band(points, rel_noise)
  if fixed < 0 and hi < 0:
    return _one_part(points, 0.0), 0.0
  if not 0 < lo <= hi <= lo * max_band:
    return prior
  tick_ports = fixed / per_port
  if not prior_tick_ports / max_ratio <= tick_ports <= (
      prior_tick_ports * max_ratio):
    return prior
  return per_port, tick_ports


def wants(points: Sequence[dict[str, Any]], ppt: float, max_points: int,
          min_spread: float) -> bool:
  """Whether a plan of ``ppt`` ports per tick adds a point: the record
  holds fewer than ``max_points`` and ``ppt`` lies outside its range by
  ``min_spread``."""
  if len(points) >= max_points:
    return False
  have = [ports_per_tick(p) for p in points]
  return ppt * min_spread <= min(have) or ppt >= max(have) * min_spread
