"""The machine's per-port record fitted on several stand-in programs.

A stand-in program's step, less its serial part, is what the tick model
prices with zero-time kernels (``cost.port_pricing``): the microbenchmark's
ticks (``idle_s``), plus ``per_port_s`` for every port operation on the
replay's critical path (``port_s`` of them: the replay's slope in the
seconds per port) plus ``fixed_s`` seconds for every tick on it
(``tick_s`` ticks: its slope in the seconds every tick pays). One stand-in
gives one equation ``excess_s = per_port_s * port_s + fixed_s * tick_s``;
two of different ports per tick separate the two parts.

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


def fit(points: Sequence[dict[str, Any]], prior_tick_ports: float,
        min_spread: float, max_ratio: float = 4.0) -> tuple[float, float]:
  """``(per_port_s, tick_ports)`` of ``points``: seconds per port
  operation and every tick's fixed cost in port operations.

  Both by weighted least squares where the points' ports per tick span at
  least ``min_spread``; else (one point, or alike) ``per_port_s`` alone
  with ``prior_tick_ports``. A fit that would make either part negative
  keeps the other alone (``tick_ports`` 0), or the prior where the
  per-port part is the negative one; one whose ``tick_ports`` is more
  than ``max_ratio`` times off the prior keeps the prior (two points timed
  on a loaded machine gave 474 port operations per tick against the six
  stand-ins' 40, and predicted the transformers 1.2-1.6x under).
  """
  if not points:
    raise ValueError("fit() needs at least one stand-in point")
  if len(points) < 2 or spread(points) < min_spread:
    return _one_part(points, prior_tick_ports), prior_tick_ports
  w = _weights(points)
  a = w[:, None] * np.array([[float(p["port_s"]), float(p["tick_s"])]
                             for p in points])
  y = w * np.array([float(p["excess_s"]) for p in points])
  (per_port, fixed), *_ = np.linalg.lstsq(a, y, rcond=None)
  if per_port <= 0:
    return _one_part(points, prior_tick_ports), prior_tick_ports
  if fixed < 0:
    return _one_part(points, 0.0), 0.0
  tick_ports = float(fixed / per_port)
  if not prior_tick_ports / max_ratio <= tick_ports <= (
      prior_tick_ports * max_ratio):
    return _one_part(points, prior_tick_ports), prior_tick_ports
  return float(per_port), tick_ports


def wants(points: Sequence[dict[str, Any]], ppt: float, max_points: int,
          min_spread: float) -> bool:
  """Whether a plan of ``ppt`` ports per tick adds a point: the record
  holds fewer than ``max_points`` and ``ppt`` lies outside its range by
  ``min_spread``."""
  if len(points) >= max_points:
    return False
  have = [ports_per_tick(p) for p in points]
  return ppt * min_spread <= min(have) or ppt >= max(have) * min_spread
