"""A mesh of fake CPU devices, for trying tessel_jax out on any machine.

``tj.cpu_mesh(4)`` asks JAX for (at least) 4 host CPU devices and returns a
one-axis mesh of the first 4. JAX fixes the number of CPU devices when its
backend starts (the first array or ``jax.devices()`` call), so call it
before any other JAX work, or set the count before importing jax::

  XLA_FLAGS=--xla_force_host_platform_device_count=4 python my_script.py

Real pipelines use ``jax.make_mesh`` over real accelerators instead.
"""

from __future__ import annotations

import os
import re
from typing import Any

_FLAG = re.compile(r"--xla_force_host_platform_device_count=(\d+)")


def _flag_count() -> int:
  """Devices asked for in ``XLA_FLAGS`` (0 when not set)."""
  match = _FLAG.search(os.environ.get("XLA_FLAGS", ""))
  return int(match.group(1)) if match else 0


def cpu_mesh(n: int = 4, axis: str = "pipe") -> Any:
  """A one-axis ``jax.sharding.Mesh`` of ``n`` fake CPU devices.

  For trying things out: examples and the README run on any machine with
  it. Asks JAX for ``max(n, XLA_FLAGS count)`` host CPU devices if its
  backend has not started yet, then builds the mesh from the first ``n``.

  Args:
    n: Devices on the mesh axis (>= 1).
    axis: Name of the mesh axis (``tj.schedule``'s ``pipe_axis``).

  Returns:
    ``jax.make_mesh((n,), (axis,))`` over the first ``n`` CPU devices.

  Raises:
    ValueError: if ``n`` is not a positive integer, or JAX already started
      with fewer than ``n`` CPU devices (the message gives the one-line
      fix).
  """
  if isinstance(n, bool) or not isinstance(n, int) or n < 1:
    raise ValueError(f"tessel_jax.cpu_mesh: n must be an integer >= 1, got"
                     f" {n!r}")
  import jax  # pylint: disable=import-outside-toplevel
  try:
    jax.config.update("jax_num_cpu_devices", max(n, _flag_count()))
  except RuntimeError:
    pass  # the backend already started; check what it has below
  devices = jax.devices("cpu")
  if len(devices) < n:
    raise ValueError(
        f"tessel_jax.cpu_mesh({n}): JAX already started with"
        f" {len(devices)} CPU device(s). Call tj.cpu_mesh before any other"
        " JAX work, or set the device count before Python imports jax:"
        f" XLA_FLAGS=--xla_force_host_platform_device_count={n}")
  return jax.make_mesh((n,), (axis,), devices=devices[:n])
