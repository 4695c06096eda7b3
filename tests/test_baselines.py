"""Tests for the classic baselines (tessel_jax.search.baselines)."""

import dataclasses
import json

import pytest

from tessel_jax import placements
from tessel_jax.search import baselines

MICROBATCHES = (1, 4, 8)
DEVICE_COUNTS = (2, 4, 8)


def check_schedule(sched, graph, n):
  """Independent check of an unrolled schedule against DESIGN §3."""
  start = {}
  for a in sched.actions:
    key = (a.block, a.microbatch)
    assert key not in start, f"action {key} appears twice"
    start[key] = a.start
  assert set(start) == {(b.id, m) for b in graph.blocks for m in range(n)}
  span = {b.id: b.span for b in graph.blocks}
  for e in graph.edges:
    for m in range(n):
      assert start[(e.dst, m)] >= start[(e.src, m)] + span[e.src] + e.delay, (
          f"edge {e.src}->{e.dst} broken in micro-batch {m}")
  for b in graph.blocks:
    for m in range(1, n):
      assert start[(b.id, m)] > start[(b.id, m - 1)]
  busy = {}
  for (blk, m), t in start.items():
    for d in graph.block(blk).devices:
      for step in range(t, t + span[blk]):
        assert (d, step) not in busy, (
            f"device {d} runs {busy[(d, step)]} and {(blk, m)} at {step}")
        busy[(d, step)] = (blk, m)
  assert min(start.values()) >= 0
  assert sched.status == "BASELINE"
  assert sched.period is None
  assert sched.num_microbatches == n
  assert sched.graph == graph


# (baseline name, placement name, placement keywords) that fit.
FITTING = [
    ("gpipe", "vshape", {}),
    ("gpipe", "vshape", {"mode": "infer"}),
    ("gpipe", "xshape", {"split_backward": True}),
    ("gpipe", "mshape", {}),
    ("gpipe", "kshape", {}),
    ("gpipe", "nnshape", {}),
    ("gpipe", "nnshape_eager", {}),
    ("gpipe", "mllm", {"mode": "infer"}),
    ("gpipe", "finetune", {}),
    ("gpipe", "alphafold", {}),
    ("gpipe", "zbv", {}),
    ("gpipe", "interleaved", {}),
    ("1f1b", "vshape", {}),
    ("1f1b", "vshape", {"split_backward": True}),
    ("interleaved_1f1b", "interleaved", {}),
    ("interleaved_1f1b", "interleaved", {"chunks": 3, "split_backward": True}),
    ("chimera", "xshape", {}),
    ("chimera", "xshape", {"split_backward": True, "b_span": 2}),
    ("zb_h1", "vshape", {"split_backward": True}),
    ("zb_h1", "vshape", {"split_backward": True, "b_span": 1}),
]


@pytest.mark.parametrize("baseline,placement,kwargs", FITTING)
@pytest.mark.parametrize("d", DEVICE_COUNTS)
def test_baseline_is_valid(baseline, placement, kwargs, d):
  graph = placements.get(placement, d, **kwargs)
  assert baseline in baselines.for_placement(graph)
  for n in MICROBATCHES:
    sched = baselines.BASELINES[baseline](graph, n)
    check_schedule(sched, graph, n)
    assert sched.source == baseline


def test_1f1b_makespan_vshape_d4_n8():
  # Derivation, D=4, F=1, B=3, N=8: the last stage gets micro-batch 0 at
  # step (D-1)F = 3 and then runs F,B pairs back to back (the earlier stages
  # deliver each next forward just in time), ending at 3 + N(F+B) = 35; the
  # last backward then walks back through D-1 stages: 35 + 3*3 = 44
  # = (N + D - 1)(F + B).
  graph = placements.vshape(4, f_span=1, b_span=3)
  assert baselines.one_f_one_b(graph, 8).makespan == 44


@pytest.mark.parametrize("f,b", [(1, 3), (1, 1), (2, 3), (3, 1)])
@pytest.mark.parametrize("d", DEVICE_COUNTS)
def test_1f1b_makespan_formula(f, b, d):
  graph = placements.vshape(d, f_span=f, b_span=b)
  for n in MICROBATCHES:
    assert baselines.one_f_one_b(graph, n).makespan == (n + d - 1) * (f + b)


@pytest.mark.parametrize("d", DEVICE_COUNTS)
def test_peak_memory_gpipe_and_1f1b(d):
  graph = placements.vshape(d)
  for n in MICROBATCHES:
    assert baselines.gpipe(graph, n).peak_memory == (n,) * d
    assert baselines.one_f_one_b(graph, n).peak_memory == tuple(
        min(n, d - s) for s in range(d))


@pytest.mark.parametrize("d", DEVICE_COUNTS)
def test_gpipe_makespan_vshape(d):
  # All forwards fill the pipe: last F ends at (N + D - 1) F; the backward
  # pipe then takes (N + D - 1) B.
  graph = placements.vshape(d, f_span=1, b_span=3)
  for n in MICROBATCHES:
    assert baselines.gpipe(graph, n).makespan == (n + d - 1) * 4


@pytest.mark.parametrize("d", DEVICE_COUNTS)
def test_zb_h1_memory_and_bubble(d):
  graph = placements.vshape(d, split_backward=True, b_span=1, w_span=1)
  for n in MICROBATCHES:
    zb = baselines.zb_h1(graph, n)
    plain = baselines.one_f_one_b(graph, n)
    assert max(zb.peak_memory) == max(plain.peak_memory) == 2 * min(n, d)
    for s in range(d):
      assert zb.peak_memory[s] <= min(2 * n, 2 * min(n, d - s) + s)
    assert zb.makespan <= plain.makespan
    if n >= d:
      # Paper's ZB-H1 bubble: (D - 1)(F + B - W) with unit spans.
      assert zb.makespan == n * 3 + (d - 1) * 1
      assert zb.makespan < plain.makespan


def test_zb_h1_defers_w_by_stage_index():
  graph = placements.vshape(4, split_backward=True, b_span=1)
  sched = baselines.zb_h1(graph, 8)
  by_block = {}
  for a in sched.actions:
    by_block[(graph.block(a.block).name, a.microbatch)] = a.start
  # Stage 3 defers W by 3: W3 of micro-batch 0 comes after B3 of mb 3.
  assert by_block[("W3", 0)] > by_block[("B3", 3)]
  # Stage 0 runs each W right after its B.
  assert by_block[("W0", 0)] == by_block[("B0", 0)] + 1


@pytest.mark.parametrize("d", (2, 4, 8))
@pytest.mark.parametrize("chunks", (2, 3))
def test_interleaved_any_microbatch_count(d, chunks):
  graph = placements.interleaved(d, chunks=chunks)
  for n in (3, 5, 9, 10):
    check_schedule(baselines.interleaved_1f1b(graph, n), graph, n)


def test_interleaved_beats_gpipe_memory():
  graph = placements.interleaved(4)
  inter = baselines.interleaved_1f1b(graph, 8)
  gp = baselines.gpipe(graph, 8)
  assert max(inter.peak_memory) < max(gp.peak_memory)
  # Megatron warm-up: device r holds (p - r - 1) * 2 + (v - 1) * p + 1.
  assert inter.peak_memory == tuple((4 - r - 1) * 2 + 4 + 1 for r in range(4))


def test_chimera_fills_bubbles():
  graph = placements.xshape(4)
  for n in (4, 8):
    chim = baselines.chimera(graph, n)
    assert chim.makespan < baselines.gpipe(graph, n).makespan
    # Each device hosts two 1F1B stages: at most (D - d) + (d + 1) in flight.
    assert max(chim.peak_memory) <= 4 + 1


def test_for_placement():
  fp = baselines.for_placement
  assert fp(placements.vshape(4)) == ["gpipe", "1f1b"]
  assert fp(placements.vshape(4, split_backward=True)) == [
      "gpipe", "1f1b", "zb_h1"]
  assert fp(placements.vshape(4, mode="infer")) == ["gpipe"]
  assert fp(placements.interleaved(4)) == ["gpipe", "1f1b",
                                           "interleaved_1f1b"]
  assert fp(placements.interleaved(4, chunks=1)) == ["gpipe", "1f1b"]
  assert fp(placements.xshape(4)) == ["gpipe", "1f1b", "chimera"]
  # 1F1B over the stage list (forward blocks in topological order) on
  # every training placement.
  for name in ("mshape", "kshape", "nnshape", "nnshape_eager", "mllm",
               "finetune", "alphafold"):
    assert fp(placements.get(name, 4)) == ["gpipe", "1f1b"], name
  assert fp(placements.zbv(4)) == ["gpipe", "1f1b", "dualpipev", "zbv"]
  assert fp(placements.zbv(4, split_backward=False)) == ["gpipe", "1f1b"]
  assert set(baselines.BASELINES) == {
      "gpipe", "1f1b", "interleaved_1f1b", "chimera", "zb_h1", "dualpipev",
      "zbv"}


def test_misfit_raises_naming_supported_placements():
  with pytest.raises(ValueError, match="xshape") as info:
    baselines.chimera(placements.mshape(4), 4)
  assert "gpipe, 1f1b" in str(info.value)  # lists what does fit
  with pytest.raises(ValueError, match="xshape"):
    baselines.chimera(placements.vshape(4), 4)
  with pytest.raises(ValueError, match="interleaved"):
    baselines.interleaved_1f1b(placements.vshape(4), 4)
  with pytest.raises(ValueError, match="split_backward=True"):
    baselines.zb_h1(placements.vshape(4), 4)
  with pytest.raises(ValueError, match="inference"):
    baselines.one_f_one_b(placements.vshape(4, mode="infer"), 4)


def test_bad_arguments():
  graph = placements.vshape(2)
  with pytest.raises(ValueError, match="num_microbatches"):
    baselines.gpipe(graph, 0)
  with pytest.raises(ValueError, match="valid names"):
    baselines.run("pipedream", graph, 4)
  assert baselines.run("1f1b", graph, 4) == baselines.one_f_one_b(graph, 4)


def test_schedule_json():
  graph = placements.vshape(4)
  sched = baselines.one_f_one_b(graph, 4)
  data = json.loads(sched.to_json())
  assert data["status"] == "BASELINE"
  assert data["period"] is None
  assert data["source"] == "1f1b"
  assert data["makespan"] == 28
  assert len(data["actions"]) == 4 * graph.num_blocks


# --- DualPipeV and ZB-V on the V placement (two stages per device) ----------


def _device_orders(sched, graph):
  """Per device: (kind, block id, micro-batch) in start order."""
  out = {d: [] for d in range(graph.num_devices)}
  for a in sorted(sched.actions, key=lambda a: a.start):
    blk = graph.block(a.block)
    out[blk.devices[0]].append((blk.kind, a.block, a.microbatch))
  return out


@pytest.mark.parametrize("name", ["dualpipev", "zbv"])
@pytest.mark.parametrize("d", DEVICE_COUNTS)
@pytest.mark.parametrize("b_span", [1, 3])
def test_v_baselines_are_valid(name, d, b_span):
  graph = placements.zbv(d, b_span=b_span)
  for n in (2 * d, 2 * d + 3):
    sched = baselines.run(name, graph, n)
    check_schedule(sched, graph, n)
    assert sched.source == name


@pytest.mark.parametrize("d", DEVICE_COUNTS)
def test_dualpipev_phases(d):
  # Rank r runs 2(D-r-1) forwards of its first stage, then r+1 pairs of
  # first/second-stage forwards: 2D forwards before its first backward (the
  # last rank starts its main phase with a forward: 2D + 1).
  # Micro-batches per block stay in order, Ws of a stage too.
  graph = placements.zbv(d)
  n = 2 * d + 2
  orders = _device_orders(baselines.dualpipev(graph, n), graph)
  for r, order in orders.items():
    kinds = [k for k, _, _ in order]
    assert kinds.index("B") == 2 * d + (r == d - 1), (r, kinds[:2 * d + 1])
    first = [m for k, b, m in order if k == "F" and b == r]
    assert first[:2 * (d - r - 1) + 1] == list(range(2 * (d - r - 1) + 1))
  with pytest.raises(ValueError, match=f"{2 * d} micro-batches"):
    baselines.dualpipev(graph, 2 * d - 1)


@pytest.mark.parametrize("d", DEVICE_COUNTS)
def test_zbv_memory_and_bubble(d):
  # ZB-V keeps 1F1B's peak (2D chunk activations of memory 2 each) and,
  # with F = B = W, nearly no bubble: 2 N (F + B + W) plus the fill.
  graph = placements.zbv(d, b_span=1)
  n = 4 * d
  zb = baselines.zbv_baseline(graph, n)
  assert max(zb.peak_memory) <= 2 * d * 2
  assert zb.makespan - n * 2 * 3 <= d
  assert zb.makespan <= baselines.dualpipev(graph, n).makespan
  assert zb.makespan <= baselines.one_f_one_b(graph, n).makespan


def test_v_baselines_misfit():
  with pytest.raises(ValueError, match="V"):
    baselines.zbv_baseline(placements.vshape(4, split_backward=True), 8)
  with pytest.raises(ValueError, match="split"):
    baselines.dualpipev(placements.zbv(4, split_backward=False), 8)
  assert baselines.canonical_name("DualPipe_V") == "dualpipev"


@pytest.mark.parametrize("d,b_span", [(2, 3), (4, 1), (4, 3)])
def test_search_ties_or_beats_v_baselines_at_their_memory(d, b_span):
  from tessel_jax import search  # pylint: disable=import-outside-toplevel
  graph = placements.zbv(d, b_span=b_span)
  n = 16
  for name in ("dualpipev", "zbv"):
    base = baselines.run(name, graph, n)
    limit = max(base.peak_memory)
    found = search.search_repetend(graph, memory_limit=limit,
                                   time_limit_s=10.0).unroll(n)
    check_schedule(dataclasses.replace(found, status="BASELINE", period=None),
                   graph, n)
    assert max(found.peak_memory) <= limit
    assert found.makespan <= base.makespan, (name, found.makespan,
                                             base.makespan)


def test_every_baseline_says_what_it_fits():
  """The registry, the fit checks and the messages name the same baselines
  (``search.baseline_fits``), and every alias names one of them."""
  from tessel_jax.search import baseline_fits  # pylint: disable=import-outside-toplevel
  assert list(baseline_fits.FITS) == list(baselines.BASELINES)
  assert list(baseline_fits.SUPPORTS) == list(baselines.BASELINES)
  assert set(baselines.ALIASES.values()) <= set(baselines.BASELINES)
  graph = placements.vshape(4)
  for name in baselines.for_placement(graph):
    assert baselines.run(name, graph, 4).source == name
