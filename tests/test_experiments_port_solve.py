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


def _point(ppt, ticks=25, per_port=1e-6, fixed=40.0, serial=5e-4):
  """A stand-in point of ``ppt`` port operations per tick whose excess is
  ``per_port`` seconds per port plus ``fixed`` ports' worth per tick."""
  port_s, tick_s = ppt * ticks, float(ticks)
  excess = per_port * (port_s + fixed * tick_s)
  return {"excess_s": excess, "port_s": port_s, "tick_s": tick_s,
          "idle_s": 1e-3, "serial_s": serial,
          "standin_s": excess + 1e-3 + serial}


def test_fits_reprice_each_step_with_each_record():
  # pylint: disable-next=import-outside-toplevel
  from experiments import port_record_probe_lib as lib
  points = {"cnn": _point(60), "mlp": _point(20), "tr": _point(200)}
  # Every step priced with a record of 0.5 us and 40 ports per tick, and
  # running 1 ms above that prediction.
  rows = {}
  for n, p in points.items():
    pred = 2.0 + 0.5e-3 * (p["port_s"] + 40 * p["tick_s"])
    rows[n] = {"pred_ms_report": pred, "per_port_ref_us": 0.5,
               "tick_ports_ref": 40.0, "step_ms_median15": pred + 1.0}
  # The record in use: the prediction itself.
  assert lib.repriced_ms(rows["tr"], points["tr"], 0.5e-6, 40.0) == (
      pytest.approx(rows["tr"]["pred_ms_report"]))
  # Twice the per-port part: the ports' share of the prediction twice.
  p = points["mlp"]
  assert lib.repriced_ms(rows["mlp"], p, 1e-6, 40.0) == pytest.approx(
      2.0 + 1e-3 * (p["port_s"] + 40 * p["tick_s"]))
  out = lib.fits(points, rows)
  assert set(out) == {"all", "first", "first2", "first3"}
  # The three points are exact (1 us, 40 ports a tick): every fit finds
  # them, and each step is its timed ms over 2 ms + 1 us per port.
  for label in out:
    assert out[label]["per_port_us"] == pytest.approx(1.0, rel=1e-3)
    for n, q in points.items():
      want = rows[n]["step_ms_median15"] / (
          2.0 + 1e-3 * (q["port_s"] + 40 * q["tick_s"]))
      assert out[label]["step_over_predicted"][n] == pytest.approx(
          want, abs=2e-3)
      assert out[label]["predicted_over_standin"][n] == pytest.approx(
          1.0, abs=2e-3)
  assert "step_over_predicted" not in lib.fits(points)["all"]
