"""The error every pass raises: names the function, the problem and the fix."""

from __future__ import annotations


class TesselError(ValueError):
  """A step function cannot be partitioned, scheduled or lowered as asked.

  Messages start with ``tessel_jax.schedule applied to '<fn>':`` and say how
  to fix the problem.
  """


def fail(fn_name: str, problem: str) -> TesselError:
  """Builds (does not raise) the error for function ``fn_name``."""
  return TesselError(f"tessel_jax.schedule applied to {fn_name!r}: {problem}")
