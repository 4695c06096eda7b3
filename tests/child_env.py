"""The environment of a test's child process (examples, README, runners).

The child makes its own devices (``tj.cpu_mesh`` or the runner's flags), so
the suite's ``--xla_force_host_platform_device_count`` is dropped; every
other ``XLA_FLAGS`` entry is kept, so the child compiles with the suite's
fast-compile flags (``-O0``, the older emitters, unless
``TESSEL_JAX_TEST_XLA_OPT=1``; see conftest.py). Subprocess tests check
outputs and files, not compile speed.
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
