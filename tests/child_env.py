"""The environment of a test's child process (examples, README, runners).

The child makes its own devices (``tj.cpu_mesh`` or the runner's flags), so
the suite's ``--xla_force_host_platform_device_count`` is dropped; every
other ``XLA_FLAGS`` entry is kept, so the child compiles at the suite's XLA
optimisation level (``-O0`` unless ``TESSEL_JAX_TEST_XLA_OPT=1``; see
conftest.py). Subprocess tests check outputs and files, not compile speed:
at ``-O0`` a child's compiles take about half the time.
"""

from __future__ import annotations

import os

_DEVICE_COUNT = "--xla_force_host_platform_device_count"


def child_env(devices: int | None = None, **extra: str) -> dict[str, str]:
  """``os.environ`` without the device count flag, plus ``extra``.

  Args:
    devices: A device count for the child's ``XLA_FLAGS`` (None: none).
    **extra: Variables set in the child's environment.
  """
  env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
  kept = [f for f in os.environ.get("XLA_FLAGS", "").split()
          if not f.startswith(_DEVICE_COUNT)]
  if devices is not None:
    kept.append(f"{_DEVICE_COUNT}={devices}")
  if kept:
    env["XLA_FLAGS"] = " ".join(kept)
  env.update(extra)
  return env
