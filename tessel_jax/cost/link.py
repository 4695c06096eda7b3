"""Communication model: seconds = latency + bytes / bandwidth.

Defaults per backend (:data:`DEFAULTS`) can be overridden with a
:class:`LinkModel`, or measured on the mesh with :func:`measure_link`: a
``lax.ppermute`` ring over the pipe axis inside ``jax.shard_map``, run for
a few payload sizes, fitted by least squares to ``latency + bytes /
bandwidth``.

The defaults:

* ``cpu``: fake host devices in one process share memory; measured on the
  2-core development machine of this project with :func:`measure_link`
  (2 single-threaded devices): 40 to 60 us per ``ppermute`` (a rendezvous of
  the devices) and 2 to 10 GB/s (noisy on a shared machine); the default is
  40 us and 5 GB/s.
* ``gpu``: NVLink-class peer links (order of magnitude: 10 us, 100 GB/s);
  PCIe-only machines are slower, measure them (``link="measure"``).
* ``tpu``: one ICI link (order of magnitude: 5 us, 45 GB/s).

The GPU and TPU figures are not measured here; they only set the scale of
edge delays until ``link="measure"`` is used.
"""

from __future__ import annotations

import dataclasses
import statistics
import time
from collections.abc import Sequence
from typing import Any

import numpy as np

from tessel_jax.cost import compile_pool as _compile_pool

#: Bump when what :func:`measure_link` or :func:`measure_gather_link`
#: measures changes (cache key). 2: inputs placed on the mesh once (were
#: made on one device and re-split over the mesh at every timed call).
LINK_VERSION = 2


@dataclasses.dataclass(frozen=True)
class LinkModel:
  """Seconds to move ``n`` bytes between two devices: ``latency + n / bw``.

  Attributes:
    latency_s: Fixed seconds per transfer.
    bandwidth_bytes_per_s: Bytes per second.
    source: ``"default"``, ``"measured"`` or ``"user"``.
  """

  latency_s: float
  bandwidth_bytes_per_s: float
  source: str = "user"

  def __post_init__(self):
    if not self.latency_s >= 0:
      raise ValueError(f"LinkModel latency_s must be >= 0, got"
                       f" {self.latency_s}")
    if not self.bandwidth_bytes_per_s > 0:
      raise ValueError(f"LinkModel bandwidth_bytes_per_s must be > 0, got"
                       f" {self.bandwidth_bytes_per_s}")

  def seconds(self, nbytes: int) -> float:
    """Seconds to move ``nbytes`` (0 bytes: no transfer, 0 seconds)."""
    if nbytes <= 0:
      return 0.0
    return self.latency_s + nbytes / self.bandwidth_bytes_per_s

  def to_dict(self) -> dict[str, Any]:
    return dataclasses.asdict(self)


DEFAULTS = {
    "cpu": LinkModel(40e-6, 5e9, "default"),
    "gpu": LinkModel(10e-6, 100e9, "default"),
    "tpu": LinkModel(5e-6, 45e9, "default"),
}


def default_link(backend: str) -> LinkModel:
  """The default model of ``backend`` (``cuda``/``rocm`` count as gpu)."""
  b = backend.lower()
  if b in ("cuda", "rocm"):
    b = "gpu"
  return DEFAULTS.get(b, DEFAULTS["gpu"])


def fit(sizes: Sequence[int], seconds: Sequence[float],
        source: str = "measured") -> LinkModel:
  """Least-squares ``latency + bytes / bandwidth`` through measured points.

  Raises:
    ValueError: with fewer than two distinct sizes.
  """
  if len(set(sizes)) < 2:
    raise ValueError("fitting a link model needs at least two payload sizes")
  mx, my = statistics.fmean(sizes), statistics.fmean(seconds)
  sxx = sum((x - mx) ** 2 for x in sizes)
  sxy = sum((x - mx) * (y - my) for x, y in zip(sizes, seconds))
  slope = max(sxy / sxx, 1e-15)
  latency = max(0.0, my - slope * mx)
  return LinkModel(latency, 1.0 / slope, source)


def _placed_zeros(mesh: Any, spec: Any, elems: int) -> Any:
  """``elems`` float32 zeros made on the host and placed once as the timed
  program reads them (``spec`` over ``mesh``): zeros made by jnp on one
  device are re-split over the mesh at every call, a transfer the timing
  would count as link time (the bug ``cost.ticks`` had, f34373b)."""
  import jax  # pylint: disable=import-outside-toplevel
  return jax.device_put(np.zeros((elems,), np.float32),
                        jax.sharding.NamedSharding(mesh, spec))


def measure_link(mesh: Any, axis: str = "pipe",
                 sizes: Sequence[int] = (1 << 12, 1 << 18, 1 << 22),
                 hops: int = 32, repeats: int = 5) -> LinkModel:
  """Times a ``lax.ppermute`` ring over ``axis`` of ``mesh`` and fits it.

  Each payload size runs ``hops`` ring shifts inside one ``fori_loop`` (so
  dispatch is paid once per sample); the median of ``repeats`` samples over
  ``hops`` is one transfer's seconds. The input is placed on the mesh once
  (:func:`_placed_zeros`), so a sample moves only the ring's bytes.

  Raises:
    ValueError: if ``axis`` has fewer than 2 devices.
  """
  import jax  # pylint: disable=import-outside-toplevel
  from jax import lax  # pylint: disable=import-outside-toplevel
  from jax.sharding import PartitionSpec as P  # pylint: disable=import-outside-toplevel

  from tessel_jax import compat  # pylint: disable=import-outside-toplevel

  _compile_pool.drain()  # no background compile while timing
  n = int(dict(mesh.shape)[axis])
  if n < 2:
    raise ValueError(f"measuring the link needs >= 2 devices on {axis!r}")
  amesh = compat.auto_mesh(mesh)
  perm = [(i, (i + 1) % n) for i in range(n)]
  points_x, points_y = [], []
  for size in sizes:
    elems = max(1, int(size) // 4)

    def body(x):
      def hop(_, v):
        return lax.ppermute(v, axis, perm) + 1.0
      return lax.fori_loop(0, hops, hop, x)

    f = jax.jit(jax.shard_map(body, mesh=amesh, in_specs=P(axis),
                              out_specs=P(axis), check_vma=False))
    x = _placed_zeros(amesh, P(axis), n * elems)
    jax.block_until_ready(f(x))
    samples = []
    for _ in range(repeats):
      t0 = time.perf_counter()
      jax.block_until_ready(f(x))
      samples.append((time.perf_counter() - t0) / hops)
    points_x.append(elems * 4)
    points_y.append(statistics.median(samples))
  return fit(points_x, points_y)


def measure_gather_link(mesh: Any, pipe_axis: str, data_axes: Sequence[str],
                        sizes: Sequence[int] = (1 << 16, 1 << 20, 1 << 22),
                        hops: int = 8, repeats: int = 5) -> LinkModel:
  """Times FSDP-style collectives over ``data_axes`` and fits them.

  Inside a ``shard_map`` manual over the pipe and data axes (as the
  program's), each sample runs ``hops`` pairs of an ``all_gather`` of a
  shard over the data axes and the ``psum_scatter`` back; one collective's
  seconds are fitted against the bytes one device receives (``(r - 1)``
  shards). On the CPU backend a sample is the smaller of its wall time and
  the process's CPU time over the cores the devices can use (a loaded
  machine does not inflate it). The input is placed once
  (:func:`_placed_zeros`). Measured on 4 CPU devices (pipe 2 x data
  2): FSDP added 8 ms to a 37 ms step where ``default_link`` priced its
  collectives at 1.0 ms.
  """
  # pylint: disable=import-outside-toplevel
  import jax
  from jax import lax
  from jax.sharding import PartitionSpec as P

  from tessel_jax import compat
  from tessel_jax.cost.call_timing import cpu_cores

  _compile_pool.drain()  # no background compile while timing
  axes = tuple(data_axes)
  r = 1
  for a in axes:
    r *= int(dict(mesh.shape)[a])
  if r < 2:
    raise ValueError(f"measuring FSDP collectives needs >= 2 devices on"
                     f" {axes!r}")
  amesh = compat.auto_mesh(mesh)
  devices = int(mesh.devices.size)
  on_cpu = mesh.devices.flat[0].platform == "cpu"
  parallel = float(min(cpu_cores(), devices)) if on_cpu else None
  manual = {pipe_axis, *axes}
  lead = int(dict(mesh.shape)[pipe_axis]) * r
  points_x, points_y = [], []
  for size in sizes:
    elems = max(1, int(size) // 4)

    def body(x):
      def hop(_, v):
        g = lax.all_gather(v, axes, tiled=True)
        return lax.psum_scatter(g, axes, tiled=True) * 0.5
      return lax.fori_loop(0, hops, hop, x)

    f = jax.jit(jax.shard_map(body, mesh=amesh,
                              in_specs=P((pipe_axis,) + axes),
                              out_specs=P((pipe_axis,) + axes),
                              axis_names=manual, check_vma=False))
    x = _placed_zeros(amesh, P((pipe_axis,) + axes), lead * elems)
    jax.block_until_ready(f(x))
    samples = []
    for _ in range(repeats):
      c0, t0 = time.process_time(), time.perf_counter()
      jax.block_until_ready(f(x))
      wall = time.perf_counter() - t0
      if parallel:
        wall = min(wall, (time.process_time() - c0) / parallel)
      samples.append(wall / (2 * hops))
    points_x.append((r - 1) * elems * 4)
    points_y.append(statistics.median(samples))
  return fit(points_x, points_y)
