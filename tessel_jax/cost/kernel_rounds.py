"""Kernels timed interleaved with each other in rounds.

The kernel profile (:mod:`tessel_jax.cost.measure`) used to time each
kernel alone, back to back: ``ROUNDS`` (2) rounds of ``repeats`` samples,
the smaller round median kept. Every sample of one kernel then falls in
the same ~20-40 ms, so a slow or fast stretch of a loaded machine moves
that kernel's whole figure, and the per-micro-batch kernel sum of one
model spread with a cv of 0.08-0.13 between builds (zoo14, session 38).
Here every kernel of a profile is compiled first, then each round times
each kernel (in a shuffled order) for :data:`SAMPLES_PER_ROUND` samples and
keeps the round's smallest; a kernel's figure is the median of its round
minima. A stretch that slows one round moves one of a kernel's
figures, and the median drops it. The number of timed samples is the
one the old timing took (``rounds * repeats``), so profiling costs the
same.

``TESSEL_JAX_INTERLEAVED_PROFILE=0`` times each kernel alone as before
(:func:`enabled`).
"""

from __future__ import annotations

import os
import random
import statistics
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from tessel_jax.cost.call_timing import calls_per_sample, one_sample

#: Environment switch: ``0`` times each kernel alone (the old timing).
ENV = "TESSEL_JAX_INTERLEAVED_PROFILE"
#: Samples of one kernel in one round (the round keeps their minimum).
SAMPLES_PER_ROUND = 2
#: Fewest rounds (a median of fewer does not drop a slow one).
MIN_ROUNDS = 3


def enabled(environ: Mapping[str, str] | None = None) -> bool:
  """Whether kernels are timed interleaved (on unless ``ENV`` is ``0``)."""
  env = os.environ if environ is None else environ
  return env.get(ENV, "1").strip() != "0"


def rounds_for(samples: int) -> int:
  """Rounds that take about ``samples`` samples of each kernel."""
  return max(MIN_ROUNDS, -(-samples // SAMPLES_PER_ROUND))


def time_interleaved(fns: Sequence[Callable[[], Any]], *, samples: int,
                     warmup: int, cpu_clock: bool, seed: int = 0
                     ) -> list[list[list[float]]]:
  """Seconds per call of each of ``fns``, timed interleaved in rounds.

  Args:
    fns: Zero-argument calls, one per kernel (each compiled already).
    samples: About how many timed samples each kernel gets in all.
    warmup: Untimed calls of each first (``call_timing.calls_per_sample``).
    cpu_clock: A sample is the smaller of wall and process CPU time
      (``call_timing.time_calls``; the caller pins the process to one core).
    seed: Seed of the rounds' shuffled order.

  Returns:
    Per call of ``fns``, per round: its samples (seconds per call).
  """
  inner = [calls_per_sample(fn, warmup) for fn in fns]
  got: list[list[list[float]]] = [[] for _ in fns]
  order = list(range(len(fns)))
  rng = random.Random(seed)
  for _ in range(rounds_for(samples)):
    rng.shuffle(order)
    for i in order:
      got[i].append([one_sample(fns[i], inner[i], cpu_clock)
                     for _ in range(SAMPLES_PER_ROUND)])
  return got


def round_minima(rounds: Sequence[Sequence[float]]) -> list[float]:
  """Each round's smallest sample."""
  return [min(r) for r in rounds]


def summary(rounds: Sequence[Sequence[float]]) -> float:
  """One kernel's figure from its rounds' samples: the median of the
  round minima."""
  return statistics.median(round_minima(rounds))
