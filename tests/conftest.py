"""Test setup: a CPU mesh of 8 fake devices, configured before jax loads.

XLA reads ``XLA_FLAGS`` and JAX reads ``JAX_PLATFORMS`` once, at import, so
they are set here, before any test module imports jax.
"""

import os

_DEVICE_FLAG = "--xla_force_host_platform_device_count=8"

if _DEVICE_FLAG not in os.environ.get("XLA_FLAGS", "").split():
  os.environ["XLA_FLAGS"] = " ".join(
      f for f in (os.environ.get("XLA_FLAGS", ""), _DEVICE_FLAG) if f)
os.environ["JAX_PLATFORMS"] = "cpu"
os.environ.setdefault("MPLBACKEND", "Agg")
