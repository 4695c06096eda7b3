"""The suite's fast-compile XLA flags (tests/conftest.py): set where this
jaxlib defines them, never one it does not (XLA aborts on those)."""

import os

import conftest


def test_flags_are_ones_this_xla_defines():
  assert conftest._xla_knows("--xla_backend_optimization_level=0")
  assert not conftest._xla_knows("--xla_cpu_no_such_flag_in_any_xla=1")
  flags = os.environ["XLA_FLAGS"].split()
  assert conftest._DEVICE_FLAG in flags
  assert all(conftest._xla_knows(f) for f in flags), flags
