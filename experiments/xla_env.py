"""XLA settings of a benchmark process, set before jax starts its client.

XLA reads ``XLA_FLAGS`` (and JAX ``JAX_PLATFORMS``) when jax creates its CPU
client at the first device use, so a runner's binary sets them here first.
No jax import: this module must load before jax does anything.
"""

from __future__ import annotations

import os
from collections.abc import Sequence

#: One intra-op thread per device: timings then barely move when other
#: processes take the other core, and N fake devices run N threads.
SINGLE_THREAD = ("--xla_cpu_multi_thread_eigen=false",
                 "intra_op_parallelism_threads=1")


def cpu_flags(devices: int | None = None,
              single_thread: bool = False) -> list[str]:
  """XLA flags for ``devices`` fake CPU devices (None: leave the count)."""
  count = ([f"--xla_force_host_platform_device_count={devices}"]
           if devices is not None else [])
  return count + (list(SINGLE_THREAD) if single_thread else [])


def add_xla_flags(flags: Sequence[str], platform: str | None = "cpu",
                  force_platform: bool = False) -> None:
  """Appends ``flags`` to ``XLA_FLAGS`` and picks the jax platform.

  Args:
    flags: XLA flags to add after the ones already set.
    platform: ``JAX_PLATFORMS`` to use (None: leave it).
    force_platform: Overwrite a ``JAX_PLATFORMS`` already set (by default
      only set it where unset).
  """
  os.environ["XLA_FLAGS"] = " ".join(
      x for x in [os.environ.get("XLA_FLAGS", "")] + list(flags) if x)
  if platform is not None:
    if force_platform:
      os.environ["JAX_PLATFORMS"] = platform
    else:
      os.environ.setdefault("JAX_PLATFORMS", platform)
