"""experiments.model_zoo_kernels_lib: kernel scopes and per-kernel self time."""

from __future__ import annotations

from experiments import model_zoo_kernels_lib as lib

_HLO = """
ENTRY %main {
  %dot.2 = f32[4,4]{1,0} dot(%a, %b), metadata={op_name="jit(run)/shard_map/tj_seg_loop/tj_kernel/k3/dot_general"}
  %fusion.7 = f32[4]{0} fusion(%a), kind=kLoop, metadata={op_name="jit(run)/shard_map/tj_kernel/k12/tanh"}
  %conditional.30 = (f32[4]{0}) conditional(%i, %t), branch_computations={%r1, %r2}
  %ppermute.21 = f32[4]{0} collective-permute(%x), channel_id=1, metadata={op_name="jit(run)/shard_map/tj_ppermute/ppermute"}
}
"""


def test_instructions_map_to_their_kernel_or_rest():
  where = lib.instruction_kernels(_HLO)
  assert where == {"dot.2": "k3", "fusion.7": "k12",
                   "conditional.30": lib.REST, "ppermute.21": lib.REST}


def test_kernel_split_counts_self_time_and_thunks_per_thread():
  where = {"conditional.30": lib.REST, "dot.2": "k3", "fusion.7": "k12"}
  ev = [
      {"ph": "X", "name": "conditional.30", "ts": 0, "dur": 100, "tid": 1},
      {"ph": "X", "name": "dot.2", "ts": 10, "dur": 70, "tid": 1},
      {"ph": "X", "name": "fusion.7", "ts": 0, "dur": 20, "tid": 2},
      {"ph": "X", "name": "dot.2", "ts": 30, "dur": 5, "tid": 2},
      {"ph": "X", "name": "unknown.1", "ts": 0, "dur": 999, "tid": 2},
      {"ph": "i", "name": "dot.2", "ts": 0, "tid": 1},
  ]
  own, count, threads = lib.kernel_split(ev, where)
  assert abs(own[lib.REST] - 30e-6) < 1e-12   # 100 - the nested dot
  assert abs(own["k3"] - 75e-6) < 1e-12
  assert abs(own["k12"] - 20e-6) < 1e-12
  assert count == {lib.REST: 1, "k3": 2, "k12": 1}
  assert threads == [2, 2]


class _K:
  def __init__(self, label, devices):
    self.label, self.devices = label, devices


def test_busier_device_sums_its_kernels_runs():
  kernels = {0: _K("F0", (0,)), 1: _K("F1", (1,)), 2: _K("B1", (1,)),
             3: _K("B0", (0,))}
  ms = {"F0": 1.0, "F1": 2.0, "B1": 2.5, "B0": 1.5}
  assert lib.busier(ms, kernels, 8) == 8 * 4.5


#: One row of ``model_zoo_kernels``' table (ms per step).
_ROW = {"model": "m", "lowered_as": "interp(25)", "predicted_ms": 10.0,
        "real_ms": 8.0, "kernels_profiled_ms": 4.0,
        "kernels_in_program_ms": 2.0, "outside_kernels_ms": 6.0,
        "standin_ms": 5.5, "real_minus_standin_ms": 2.5,
        "kernels_looped_ms": 1.0, "kernels_looped_lockstep_ms": 1.5,
        "kernels_profiled_lockstep_ms": 5.0,
        "thunks_per_device": 100.0, "kernel_thunks_per_device": 40.0}


def _cells(row: dict) -> dict[str, str]:
  """Column title -> cell of ``row`` in the markdown table."""
  head, _, line = lib.markdown([row]).splitlines()
  return dict(zip(head.strip("| ").split(" | "), line.strip("| ").split(" | ")))


def test_the_table_says_what_the_kernels_add_to_their_stand_in():
  row = _ROW
  cells = _cells(row)
  assert cells["real - stand-in"] == "2.50"
  assert cells["stand-in"] == "5.50"
  assert cells["real / predicted"] == "0.800"
  assert cells["real / predicted, loop + thunks"] == "-"
  cells = _cells({**row, "standin_ms": None, "real_minus_standin_ms": None})
  assert cells["stand-in"] == cells["real - stand-in"] == "-"


def test_real_and_stand_in_are_timed_in_alternated_rounds():
  seen = []
  runs = {"real": lambda: "r", "standin": lambda: "s"}
  timer = lambda run: seen.append(run()) or (2.0 if run() == "r" else 1.5)
  steps = lib.paired_steps(runs, rounds=4, timer=timer)
  assert steps == {"real": [2.0] * 4, "standin": [1.5] * 4}
  # Every round runs each program once, so the two alternate.
  assert all(sorted(seen[i:i + 2]) == ["r", "s"] for i in range(0, 8, 2))


def test_the_table_shows_the_kernels_priced_in_a_loop():
  cells = _cells({**_ROW, "kernels_looped_ms": 1.25})
  assert cells["kernels in a loop"] == "1.25"
  assert cells["lockstep: profiled / in a loop"] == "5.00 / 1.50"


class _Tick:
  def __init__(self, kernels):
    self.kernels = kernels


class _Plan:
  def __init__(self, kernels, ticks):
    self.kernels, self.ticks = kernels, [_Tick(t) for t in ticks]


def test_lockstep_sums_each_ticks_slowest_kernel():
  kernels = {0: _K("F0", (0,)), 1: _K("F1", (1,)), 2: _K("B1", (1,)),
             3: _K("B0", (0,))}
  ms = {"F0": 1.0, "F1": 2.0, "B1": 2.5, "B0": 1.5}
  plan = _Plan(kernels, [(0, None), (None, 1), (0, 1), (3, 2), (3, 2)])
  # Each device runs its two kernels twice: the busier one (F1 + B1)
  # takes 9 ms alone, but in lockstep a tick lasts its slowest kernel:
  # 1 + 2 + max(1, 2) + max(1.5, 2.5) + max(1.5, 2.5).
  assert lib.busier(ms, kernels, 2) == 9.0
  assert lib.lockstep(ms, plan) == 1.0 + 2.0 + 2.0 + 2.5 + 2.5


def test_lockstep_thunks_follow_each_ticks_slowest_kernel():
  kernels = {0: _K("F0", (0,)), 1: _K("F1", (1,)), 2: _K("B1", (1,)),
             3: _K("B0", (0,))}
  ms = {"F0": 1.0, "F1": 2.0, "B1": 2.5, "B0": 1.5}
  thunks = {"F0": 10, "F1": 20, "B1": 30, "B0": 40}
  plan = _Plan(kernels, [(0, None), (None, 1), (0, 1), (3, 2)])
  # F0, F1, F1 (slower than F0), B1 (slower than B0 though fewer thunks).
  assert lib.lockstep_thunks(ms, thunks, plan) == 10 + 20 + 20 + 30


def test_per_thunk_figure_is_fitted_on_the_reference_and_priced_on_rows():
  ref = {"model": "ref", "real_minus_standin_ms": 1.0,
         "kernels_looped_lockstep_ms": 0.6, "lockstep_thunks": 1000}
  per = lib.per_thunk_ms(ref)
  assert abs(per - 0.4e-3) < 1e-12             # 0.4 us per thunk
  row = {"model": "m", "predicted_ms": 10.0, "real_ms": 9.0,
         "kernels_profiled_lockstep_ms": 4.0,
         "kernels_looped_lockstep_ms": 1.5, "lockstep_thunks": 2500}
  got = lib.with_thunk_pricing(row, per)
  # Kernels 1.5 + 2500 x 0.4 us = 2.5 ms instead of the profile's 4.0.
  assert got["kernels_thunk_priced_ms"] == 2.5
  assert got["predicted_thunk_priced_ms"] == 8.5
  assert got["real_over_thunk_priced"] == round(9.0 / 8.5, 3)
  assert got["real_over_predicted"] == 0.9
  assert got["added_over_thunk_priced"] is None   # no stand-in timed
  assert lib.with_thunk_pricing({**row, "real_minus_standin_ms": 2.0},
                                per)["added_over_thunk_priced"] == 0.8
  assert lib.per_thunk_ms({"real_minus_standin_ms": None}) is None
  assert lib.with_thunk_pricing(row, None) is row
  # A reference whose kernels add less than their loop prices no thunk.
  assert lib.with_thunk_pricing(row, -1e-3)["kernels_thunk_priced_ms"] == 1.5


def test_replay_fit_solves_the_reference_kernel_term():
  # A replay whose kernel term is 1 ms of loop plus 2000 thunks, with a
  # bend (the other device's work hides the first 0.2 ms of thunks).
  term = lambda f: 1e-3 + max(0.0, 2000 * f - 0.2e-3)
  f = lib.replay_fit(2e-3, term)
  assert abs(term(f) - 2e-3) < 1e-8 and abs(f - 0.6e-6) < 1e-9
  # The loop alone already above what the kernels add: a negative figure.
  assert lib.replay_fit(0.5e-3, lambda f: 1e-3 + 1000 * f) < 0
  assert lib.thunk_work({1: 1e-3, 2: 2e-3}, {1: 10, 2: 20}, 1e-6) == {
      1: 1e-3 + 10e-6, 2: 2e-3 + 20e-6}


def test_replay_pricing_swaps_the_profiled_kernel_term():
  row = {"model": "m", "predicted_ms": 10.0, "real_ms": 9.0,
         "real_minus_standin_ms": 3.0, "replayed_profiled_ms": 5.0}
  term = lambda f: 1e-3 + 1000 * f          # seconds
  got = lib.with_replay_pricing(row, 1e-6, term)
  assert got["replayed_thunk_priced_ms"] == 2.0
  assert got["predicted_replay_priced_ms"] == 7.0    # 10 - 5 + 2
  assert got["real_over_replay_priced"] == round(9 / 7, 3)
  assert got["added_over_replay_priced"] == 1.5
  # Negative figure: the loop alone.
  assert lib.with_replay_pricing(row, -1e-6, term)[
      "replayed_thunk_priced_ms"] == 1.0
  assert lib.with_replay_pricing(row, None, term) is row
  assert lib.with_replay_pricing(row, 1e-6, None) is row


def test_parts_split_the_prediction_into_kernel_term_and_stand_in():
  row = {"model": "m", "predicted_ms": 10.0, "real_ms": 9.0,
         "standin_ms": 5.0, "real_minus_standin_ms": 2.0,
         "replayed_profiled_ms": 4.0}
  got = lib.with_parts(row)
  assert got["predicted_rest_ms"] == 6.0             # 10 - 4
  assert got["kernel_term_over_added"] == 2.0        # 4 / 2: over-priced
  assert got["rest_over_standin"] == 1.2             # 6 / 5
  assert lib.with_parts({**row, "standin_ms": None}) == {
      **row, "standin_ms": None}
  cells = _cells({**_ROW, **lib.with_parts({**_ROW, **row})})
  assert cells["kernel term / (real - stand-in)"] == "2.00"
  assert cells["rest / stand-in"] == "1.20"
