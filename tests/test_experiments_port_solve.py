"""The one-stand-in per-port solve of ``experiments.port_record_probe``."""

from __future__ import annotations

import pytest

from experiments import port_solve


@pytest.mark.parametrize("bend", [0.0, 0.3])
def test_solve_inverts_the_replay(bend):
  # 500 port operations on the critical path over 2 ms of kernels; a bend
  # (the shared-core replay) is corrected by the second step.
  replay = lambda x: 0.002 + 500 * x + bend * (500 * x) ** 2
  x = port_solve.solve(0.004, replay, 0.0, 1e-6)
  assert replay(x) == pytest.approx(0.004, rel=0.01)
  # A program no slower than its prediction prices nothing more.
  assert port_solve.solve(0.001, replay, 0.0, 1e-6) == 0.0
  assert port_solve.solve(0.5, lambda x: 0.1, 0.0, 1e-6) == 0.0
