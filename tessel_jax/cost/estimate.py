"""Kernel seconds without compiling: XLA's cost analysis, calibrated.

Compiling a kernel for timing costs about 0.3-0.5 CPU seconds on the CPU
backend, most of a cold ``placement="auto"`` choice (README GPT, 4 devices:
76 kernels, 39 of 87 s). Lowering the same kernel and asking XLA's cost
analysis for its floating-point operations costs about 0.05 s. A
:class:`KernelEstimator` turns those flops into seconds with the rate of the
kernels already measured in the process (per kind ``F``/``B``/``W``: the
backward runs fewer flops per second than the forward, 2-3e10 against
3.5-4.5e10 on this machine), so the screening builds of
``tessel_jax.plans`` price every plan without compiling it and only the
plans worth it are measured.

Measured on the README GPT's kernels (loaded machine): seconds / flops
varies by a factor of about 1.6 either way around the median (coefficient
of variation 0.30; adding bytes accessed made it worse, 0.34-0.49), so an
estimate ranks plans, it does not price them: the plans that may win are
built again with every kernel measured.

Estimates are never stored: neither in the measurement memo nor on disk.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

#: Measured kernels (with flops) needed before anything is estimated.
MIN_SAMPLES = 4
#: Measured kernels of one kind needed to use that kind's own rate.
MIN_KIND_SAMPLES = 2


class KernelEstimator:
  """Seconds of unmeasured kernels from their flops and the measured ones.

  Calibrated on measurement records (``measure.time_kernel`` results with
  a ``flops`` field and a ``label``): a kernel's estimate is its flops times
  the median seconds per flop of the measured kernels of its kind (all
  kinds when fewer than :data:`MIN_KIND_SAMPLES` of its kind are known).

  Attributes:
    estimated: Kernels estimated so far.
  """

  def __init__(self, flops_of: Callable[[Any, Sequence[Any]], float | None]
               | None = None) -> None:
    """``flops_of(kernel, param_avals)``: a kernel's flops (default
    ``cost.measure.kernel_flops``: lowered, not compiled)."""
    self.estimated = 0
    self._flops_of = flops_of
    self._flops: dict[str, float | None] = {}  # by kernel cache key

  def _kernel_flops(self, kernel: Any, param_avals: Sequence[Any]
                    ) -> float | None:
    if self._flops_of is None:
      # Function level: ``cost.measure`` imports jax.
      from tessel_jax.cost import measure  # pylint: disable=import-outside-toplevel
      self._flops_of = measure.kernel_flops
    return self._flops_of(kernel, param_avals)

  @staticmethod
  def rates(records: Iterable[Mapping[str, Any]]) -> dict[str, list[float]]:
    """Seconds per flop of the measured records, by kernel kind (``*``:
    every kind)."""
    out: dict[str, list[float]] = {"*": []}
    for rec in records:
      flops, sec = rec.get("flops"), rec.get("seconds")
      if not flops or not sec or rec.get("estimated"):
        continue
      kind = str(rec.get("label", "?"))[:1]
      out.setdefault(kind, []).append(float(sec) / float(flops))
      out["*"].append(float(sec) / float(flops))
    return out

  def ready(self, records: Iterable[Mapping[str, Any]]) -> bool:
    """Whether enough kernels are measured to estimate the others."""
    return len(self.rates(records)["*"]) >= MIN_SAMPLES

  def still_to_measure(self, records: Iterable[Mapping[str, Any]]) -> int:
    """Kernels to measure before it estimates the others (0: ready)."""
    return max(0, MIN_SAMPLES - len(self.rates(records)["*"]))

  def estimate(self, kernel: Any, param_avals: Sequence[Any],
               records: Iterable[Mapping[str, Any]], key: str | None = None
               ) -> dict[str, Any] | None:
    """A record like ``measure.time_kernel``'s (``estimated=True``,
    ``temp_bytes`` 0: the workspace is known only once compiled), or None
    when the kernel's flops are unknown or too few kernels are measured.
    ``key`` (the kernel's cache key) remembers its flops."""
    rates = self.rates(records)
    if len(rates["*"]) < MIN_SAMPLES:
      return None
    if key is not None and key in self._flops:
      flops = self._flops[key]
    else:
      flops = self._kernel_flops(kernel, param_avals)
      if key is not None:
        self._flops[key] = flops
    if flops is None:
      return None
    own = rates.get(kernel.kind, [])
    rate = statistics.median(own if len(own) >= MIN_KIND_SAMPLES
                             else rates["*"])
    seconds = flops * rate
    self.estimated += 1
    return {"seconds": seconds, "core_seconds": seconds,
            "raw_seconds": seconds, "temp_bytes": 0, "flops": flops,
            "compile_seconds": 0.0, "estimated": True,
            "label": kernel.label}
