"""The measured cost model: quantisation, cache, edge delays, report.

The suite's default is ``TESSEL_JAX_COST=uniform`` (tests/conftest.py); the
measured path is exercised here with ``cost="measured"`` on tiny models and
a per-test cache directory. No timed assertions: only structure and
consistency of the figures.
"""

from __future__ import annotations

import dataclasses
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import tessel_jax as tj
from tessel_jax import placements, validate
from tessel_jax.cost import cache as cost_cache
from tessel_jax.cost import link as cost_link
from tessel_jax.cost import measure, predict, quantize, ticks
from tessel_jax.graph import Edge
from tessel_jax.schedule import Action, UnrolledSchedule
from tessel_jax.search import search_repetend
from passes import flushes

import test_lowering_models as M


# Builds here price ticks with the microbenchmark's figures, not test them:
# measured once per worker and mesh (conftest.shared_tick_costs).
pytestmark = pytest.mark.usefixtures("shared_tick_costs")

TOL = 1e-5


# --- quantisation (pure Python) ---------------------------------------------


def test_quantisation_round_trip_is_exact_on_the_grid():
  graph = placements.vshape(2)
  res = 0.25e-3
  steps = {0: 3, 1: 5, 2: 9, 3: 6}
  seconds = {b: s * res for b, s in steps.items()}
  q = quantize.quantize(graph, seconds, resolution=res)
  assert {b.id: b.span for b in q.graph.blocks} == steps
  assert q.time_error == pytest.approx(0.0, abs=1e-12)
  assert max(q.block_errors.values()) == pytest.approx(0.0, abs=1e-12)
  back = {b.id: b.span * q.resolution for b in q.graph.blocks}
  assert back == pytest.approx(seconds)


@settings(max_examples=40, deadline=None)
@given(st.lists(st.floats(1e-5, 1e-1), min_size=4, max_size=4),
       st.integers(4, 48))
def test_quantisation_round_trip_within_half_a_step(raw, max_steps):
  graph = placements.vshape(2)
  seconds = dict(enumerate(raw))
  q = quantize.quantize(graph, seconds, max_steps=max_steps)
  busiest = max(sum(seconds[b.id] for b in graph.blocks_on(d))
                for d in range(2))
  assert q.resolution >= busiest / max_steps * (1 - 1e-9)
  for b in q.graph.blocks:
    assert b.span >= 1
    if seconds[b.id] >= q.resolution / 2:
      assert abs(b.span * q.resolution - seconds[b.id]) <= q.resolution / 2 + 1e-15
    else:
      assert b.span == 1        # every block takes at least one step
  # The busiest device never exceeds max_steps by more than the rounding.
  for d in range(2):
    assert sum(b.span for b in q.graph.blocks_on(d)) <= max_steps + 2


def test_default_resolution_is_the_coarsest_within_tolerance():
  graph = placements.vshape(2)
  # F = 1 ms, B = 2 ms: 3 steps on the busiest device already exact.
  seconds = {0: 1e-3, 1: 1e-3, 2: 2e-3, 3: 2e-3}
  q = quantize.quantize(graph, seconds)
  assert [b.span for b in q.graph.blocks] == [1, 1, 2, 2]
  assert q.resolution == pytest.approx(1e-3)
  # Uneven blocks need a finer step; the error it reaches is reported.
  seconds = {0: 1e-3, 1: 1.3e-3, 2: 2.9e-3, 3: 2.2e-3}
  q = quantize.quantize(graph, seconds, tolerance=0.05)
  assert max(q.time_error, q.load_error) <= 0.05
  coarse = quantize.quantize(graph, seconds, resolution=q.resolution * 2)
  assert max(coarse.time_error, coarse.load_error) > 0.05 or (
      q.resolution * 2 > 4.2e-3)


def test_memory_rounding_is_conservative():
  graph = placements.vshape(2)
  mem = {0: 1000, 1: 37, 2: -37, 3: -1000}
  q = quantize.quantize(graph, {b: 1e-3 for b in range(4)}, mem)
  unit = q.memory_unit
  assert unit == math.ceil(1000 / quantize.MEMORY_UNITS)
  for b in q.graph.blocks:
    assert abs(b.memory) * unit >= abs(mem[b.id])        # never under
    assert abs(b.memory) * unit < abs(mem[b.id]) + unit
  assert q.graph.block(1).memory == -q.graph.block(2).memory  # balanced
  assert quantize.limit_units(10 * unit + unit - 1, unit) == 10  # down
  assert quantize.limit_units(None, unit) is None


def test_quantize_rejects_missing_or_zero_durations():
  graph = placements.vshape(2)
  with pytest.raises(ValueError, match="no positive measured seconds"):
    quantize.quantize(graph, {0: 1e-3, 1: 1e-3, 2: 0.0, 3: 1e-3})
  with pytest.raises(ValueError, match="resolution"):
    quantize.to_steps(1.0, 0.0)


def test_plan_error_formula():
  assert quantize.plan_error(10, 0.5e-3, 5e-3) == 0.0
  assert quantize.plan_error(11, 0.5e-3, 5e-3) == pytest.approx(0.1)


# --- edge delays --------------------------------------------------------------


def test_edge_delays_reach_the_search_and_the_validator():
  graph = placements.vshape(2)
  seconds = {0: 1e-3, 1: 1e-3, 2: 2e-3, 3: 2e-3}
  delays = {(0, 1): 2e-3, (2, 3): 1e-3}      # between the two devices
  q = quantize.quantize(graph, seconds, delay_seconds=delays,
                        resolution=1e-3)
  got = {(e.src, e.dst): e.delay for e in q.graph.edges}
  assert got[(0, 1)] == 2 and got[(2, 3)] == 1 and got[(1, 2)] == 0
  run = search_repetend(q.graph, time_limit_s=10).unroll(6)
  validate.assert_valid(run)
  start = {(a.block, a.microbatch): a.start for a in run.actions}
  for e in q.graph.edges:
    for m in range(6):
      assert start[(e.dst, m)] >= (start[(e.src, m)] +
                                   q.graph.block(e.src).span + e.delay)
  # A schedule searched without the delays breaks them: the validator says so.
  plain = quantize.quantize(graph, seconds, resolution=1e-3).graph
  fast = search_repetend(plain, time_limit_s=10).unroll(6)
  ignored = UnrolledSchedule(graph=q.graph, num_microbatches=6,
                             actions=fast.actions)
  violations = validate.check(ignored)
  assert any(v.kind == "dependency" and "delay" in v.message
             for v in violations)


def test_link_model_and_fit():
  link = cost_link.LinkModel(10e-6, 1e9)
  assert link.seconds(0) == 0.0
  assert link.seconds(1000) == pytest.approx(10e-6 + 1e-6)
  fitted = cost_link.fit([1000, 11000], [11e-6, 21e-6])
  assert fitted.latency_s == pytest.approx(10e-6)
  assert fitted.bandwidth_bytes_per_s == pytest.approx(1e9)
  assert cost_link.default_link("cuda") == cost_link.DEFAULTS["gpu"]
  with pytest.raises(ValueError, match="bandwidth"):
    cost_link.LinkModel(0.0, 0.0)


# --- prediction ---------------------------------------------------------------


def _two_stage(actions):
  graph = dataclasses.replace(
      placements.vshape(2),
      blocks=tuple(dataclasses.replace(b, span=1 if b.kind == "F" else 2,
                                       memory=1 if b.kind == "F" else -1)
                   for b in placements.vshape(2).blocks))
  return UnrolledSchedule(graph=graph, num_microbatches=1,
                          actions=tuple(Action(*a) for a in actions))


def test_predict_replays_real_durations_in_device_order():
  # F0 | F1 | B1 | B0 of one micro-batch: a chain across the two devices.
  run = _two_stage([(0, 0, 0), (1, 1, 0), (2, 2, 0), (4, 3, 0)])
  sec = {0: 1.0, 1: 2.0, 2: 3.0, 3: 4.0}
  p = predict.predict(run, sec, memory_bytes={0: 10, 1: 20, 2: -20, 3: -10})
  assert p.step_seconds == pytest.approx(10.0)
  assert p.busy_seconds == (5.0, 5.0)
  assert p.bubble_ratio == pytest.approx(0.5)
  assert p.peak_bytes == (10, 20)
  delayed = predict.predict(run, sec, delays={(0, 1): 0.5})
  assert delayed.step_seconds == pytest.approx(10.5)
  # A barrier before step 4 waits for every device; each tick costs 0.1 on
  # every device (dev1's first tick hides behind its wait for F0): F0 ends
  # at 1, F1 runs 1..3, B1 3.1..6.1, the barrier ends at 6.2 + 0.25, B0 runs
  # 6.45..10.45, its tick's cost ends the step at 10.55.
  barred = predict.predict(run, sec, barriers={4: 0.25}, tick_seconds=0.1)
  assert barred.step_seconds == pytest.approx(10.55)


def test_predict_shared_splits_the_cores_among_busy_devices():
  # Two independent one-block chains at the same tick: on two cores each
  # runs at full speed, on one core they share it (both take twice as long).
  graph = tj.make_graph("two", 2, [(0, "F", 1, 0, (0,)), (1, "F", 1, 0, (1,))])
  run = UnrolledSchedule(graph=graph, num_microbatches=1,
                         actions=(Action(0, 0, 0), Action(0, 1, 0)))
  work, par = {0: 1.0, 1: 1.0}, {0: 1.0, 1: 1.0}
  assert predict.predict_shared(run, work, par, 2.0).step_seconds == (
      pytest.approx(1.0))
  assert predict.predict_shared(run, work, par, 1.0).step_seconds == (
      pytest.approx(2.0))
  # A block that can use two cores runs alone twice as fast.
  lone = UnrolledSchedule(graph=graph, num_microbatches=1,
                          actions=(Action(0, 0, 0),) + (Action(1, 1, 0),))
  two = predict.predict_shared(lone, work, {0: 2.0, 1: 2.0}, 2.0)
  assert two.step_seconds == pytest.approx(1.0)


def test_predict_shared_waits_for_inputs_and_barriers():
  run = _two_stage([(0, 0, 0), (1, 1, 0), (2, 2, 0), (4, 3, 0)])
  sec = {0: 1.0, 1: 2.0, 2: 3.0, 3: 4.0}
  ones = {b: 1.0 for b in sec}
  # One device per core: the plain replay.
  shared = predict.predict_shared(run, sec, ones, 2.0, delays={(0, 1): 0.5})
  plain = predict.predict(run, sec, delays={(0, 1): 0.5})
  assert shared.step_seconds == pytest.approx(plain.step_seconds)
  assert shared.starts == pytest.approx(plain.starts)
  # A barrier right after step 0 and per-tick work of 0.1 on one core:
  # F0 + its tick end at 1.1, the barrier at 1.35; F1 runs 1.35..3.35, its
  # tick to 3.45; B1 3.45..6.45; B0 waits for it: 6.45..10.45, tick 10.55.
  barred = predict.predict_shared(run, sec, ones, 2.0,
                                  barriers_after={0: 0.25}, tick_seconds=0.1)
  assert barred.step_seconds == pytest.approx(10.55)


def test_tick_model_prices_ticks_and_rendezvous():
  mesh = jax.make_mesh((2,), ("pipe",))
  fn, params, batch = _tiny(kinds=("embed", "head"))
  # The loop lowering (straight runs and loop iterations; the compact one:
  # test_tick_model_prices_held_rounds_at_their_flushes).
  step = tj.schedule(fn, mesh=mesh, placement=placements.vshape(2),
                     num_microbatches=4, interpret_ramps=8)
  plan = step.build(params, batch).plan
  link = cost_link.LinkModel(1e-3, 1e9)
  costs = ticks.TickCosts(fixed_s=1e-4, per_byte_s=1e-9)
  free = ticks.tick_model(plan, link, costs)
  assert free.edge_delays and not free.barriers and not free.barriers_after
  assert set(free.tick_costs) == {t.step for t in plan.ticks}
  for t in plan.ticks:
    traffic = ticks.tick_traffic(t, plan.layout)
    assert traffic > 0
    assert free.tick_costs[t.step] == pytest.approx(1e-4 + 1e-9 * traffic)
  rv = ticks.tick_model(plan, link, costs, rendezvous=True)
  assert not rv.edge_delays
  remote = sum(1 for t in plan.ticks for rd in t.sends if rd.remote)
  assert remote > 0
  # Every ppermute the lowering emits is priced once: held remote rounds
  # are written at their first reader, equal-shaped ones merged
  # (passes.flushes), per straight run and loop iteration.
  expected = 0.0
  for seg in plan.segments:
    assert seg.kind != "interp"
    body = list(range(seg.start, seg.start + seg.period))
    for positions in flushes.remote_flushes(plan.ticks, body):
      rounds = [rd for j in positions for rd in plan.ticks[body[j]].sends
                if rd.remote]
      expected += seg.iterations * sum(
          link.seconds(rounds[g[0]].payload.nbytes)
          for g in flushes.merge_rounds(rounds))
  every = sum(link.seconds(rd.payload.nbytes) for t in plan.ticks
              for rd in t.sends if rd.remote)
  assert 0 < rv.barrier_seconds == pytest.approx(expected)
  assert expected <= every


def test_tick_model_prices_held_rounds_at_their_flushes():
  mesh = jax.make_mesh((2,), ("pipe",))
  fn, params, batch = _tiny(kinds=("embed", "head"))
  # The default lowering: compact, interpret_ramps=0.
  step = tj.schedule(fn, mesh=mesh, placement=placements.vshape(2),
                     num_microbatches=4)
  built = step.build(params, batch)
  plan = built.plan
  assert [seg.kind for seg in plan.segments] == ["interp"]
  assert built.report.lowering == ("lowering compact (interpret_ramps=0,"
                                   " auto)")
  assert built.report.lowering in built.report.summary()
  link = cost_link.LinkModel(1e-3, 1e9)
  rv = ticks.tick_model(plan, link, ticks.TickCosts(), rendezvous=True)
  # The compact lowering holds remote messages in outboxes (passes.held):
  # one ppermute per remote round at each boundary its flush table marks,
  # none before the first tick, not one per tick that made a message.
  spec = plan.interps[0]
  expected, after = 0.0, {}
  for rd in spec.sends:
    if rd.remote:
      for f in np.flatnonzero(np.asarray(rd.flush).any(axis=-1)):
        assert f > 0
        expected += link.seconds(rd.payload.nbytes)
        step_of = plan.ticks[int(f) - 1].step
        after[step_of] = after.get(step_of, 0) + link.seconds(
            rd.payload.nbytes)
  every = sum(link.seconds(rd.payload.nbytes) for t in plan.ticks
              for rd in t.sends if rd.remote)
  assert not rv.barriers
  assert rv.barriers_after == pytest.approx(after)
  assert 0 < rv.barrier_seconds == pytest.approx(expected)
  assert expected < every


# --- measurement and cache (jax) ----------------------------------------------


def _tiny(rows_per_mb=4, n=4, kinds=("embed", "layer", "head")):
  fn = M.chain_fn(list(kinds))
  params = M.make_params(M.num_layers(list(kinds)))
  return fn, params, M.make_batch(n * rows_per_mb)


def test_cache_hit_and_invalidation(tmp_path, measured_first_only):
  mesh = jax.make_mesh((2,), ("pipe",))
  fn, params, batch = _tiny()
  placement = tj.Placement([(0, 1), 0, 1])

  def build(batch, fn=fn, **kw):
    step = tj.schedule(fn, mesh=mesh, placement=placement,
                       num_microbatches=4, cost="calibrated",
                       cache_dir=str(tmp_path), solver_time_limit_s=10, **kw)
    return step.build(params, batch).report

  cold = build(batch)
  assert not cold.cache_hit and cold.kernels_measured >= 1
  files = sorted(p.name for p in tmp_path.iterdir())
  assert any(f.startswith("kernel-") for f in files)
  assert all(f.split("-")[0] in ("kernel", "ticks", "schedule", "standin",
                                 "outside")
             for f in files)
  assert any(f.startswith("standin-") for f in files)  # calibrate.py
  warm = build(batch)                                   # a new function
  assert warm.cache_hit and warm.kernels_measured == 0
  assert warm.block_ms == cold.block_ms                 # the stored figures
  # Other shapes (rows per micro-batch): other keys, measured again.
  other = build(M.make_batch(4 * 8))
  assert not other.cache_hit and other.kernels_measured >= 1
  # Another jaxpr for the same shapes: the changed blocks miss.
  fn2 = M.chain_fn(["embed", "layer", "head"])

  def fn_scaled(p, b):
    return fn2(p, b) * 2.0

  changed = build(batch, fn=fn_scaled)
  assert 1 <= changed.kernels_measured
  # reprofile ignores what is stored (and stores the new figures).
  store = cost_cache.ProfileCache(str(tmp_path))
  key = sorted(tmp_path.iterdir())[0].name.split("-", 1)[1][:-5]
  kind = sorted(tmp_path.iterdir())[0].name.split("-", 1)[0]
  assert store.get(kind, key) is not None
  assert cost_cache.ProfileCache(str(tmp_path), reprofile=True).get(
      kind, key) is None


def test_identical_kernels_share_one_measurement():
  mesh = jax.make_mesh((4,), ("pipe",))
  kinds = ["embed", "layer", "layer", "layer", "head"]
  fn, params, batch = _tiny(kinds=kinds)
  step = tj.schedule(fn, mesh=mesh, placement=placements.mshape(4),
                     num_microbatches=4, cost="measured",
                     solver_time_limit_s=10)
  built = step.build(params, batch)
  prof = built.profile
  keys = {k.key for k in prof.kernels.values()}
  assert prof.measured + prof.from_cache == len(keys) < len(prof.kernels)
  f1, f2 = (prof.kernels[built.kernels.forward_ids[i]] for i in (2, 3))
  assert f1.key == f2.key and f1.seconds == f2.seconds


def test_kernel_key_changes_with_shapes_and_program():
  dev = jax.devices()[0]
  a = cost_cache.make_key({"x": 1})
  assert a == cost_cache.make_key({"x": 1}) != cost_cache.make_key({"x": 2})
  mesh = jax.make_mesh((2,), ("pipe",))
  fn, params, batch = _tiny()
  step = tj.schedule(fn, mesh=mesh, placement=tj.Placement([(0, 1), 0, 1]),
                     num_microbatches=4, cost="uniform")
  built = step.build(params, batch)
  avals = built.partition.traced.param_avals
  ks = built.kernels.kernels.values()
  traced = {measure.kernel_key(k, avals, dev) for k in ks}
  blocks = built.partition.blocks
  fast = {measure.kernel_key(k, avals, dev, blocks[k.fwd]) for k in ks}
  assert len(traced) == len(fast) == len(ks)      # all different work


def test_edge_bytes_follow_the_kernel_avals():
  mesh = jax.make_mesh((2,), ("pipe",))
  fn, params, batch = _tiny()
  step = tj.schedule(fn, mesh=mesh, placement=tj.Placement([0, 0, 1]),
                     num_microbatches=4, cost="uniform")
  built = step.build(params, batch)
  ks, graph = built.kernels, built.graph
  got = measure.edge_bytes(graph, ks)
  f = ks.forward_ids
  assert got[(f[0], f[1])] == 0                   # same device
  cross = got[(f[1], f[2])]
  want = sum(np.prod(a.shape) * np.dtype(a.dtype).itemsize
             for a in ks.kernels[f[2]].in_avals)
  assert 0 < cross <= want


def test_measured_cost_equals_value_and_grad_and_reports():
  graph = placements.vshape(2)
  fn, params, batch = _tiny(n=4, kinds=("embed", "head"))
  mesh = jax.make_mesh((2,), ("pipe",))
  step = tj.schedule(fn, mesh=mesh, placement=graph, num_microbatches=4,
                     cost="measured", optimizer_slots=2,
                     solver_time_limit_s=10)   # the session's cache
  loss, grads = step(params, batch)
  ref_loss, ref_grads = M.reference(fn, params, batch, 4)
  assert M.max_rel_err(loss, ref_loss) <= TOL
  assert M.max_rel_err(grads, ref_grads) <= TOL
  rep = step.report
  assert rep is step.built.report and rep.cost == "measured"
  assert rep.predicted_step_ms > 0 and rep.time_resolution_s > 0
  assert 0.0 <= rep.bubble_ratio < 1.0
  assert rep.block_error >= 0.0
  assert rep.profile_seconds >= 0.0 and isinstance(rep.cache_hit, bool)
  assert set(rep.block_ms) == {b.label for b in step.built.graph.blocks}
  params_b = step.built.layout.bytes_per_device()
  assert len(rep.peak_memory_bytes) == 2
  for d in range(2):  # params + grads + 2 Adam slots + stash + workspace
    assert rep.peak_memory_bytes[d] >= 4 * params_b[d] + rep.stash_peak_bytes[d]
  assert any(s > 0 for s in rep.stash_peak_bytes)
  assert "predicted step" in rep.summary()
  assert set(rep.to_dict()) >= {"predicted_step_ms", "peak_memory_bytes",
                                "bubble_ratio", "quantization_error",
                                "profile_seconds", "cache_hit"}
  # The schedule searched on measured spans is lowered, unless the one
  # searched on them on a coarser grid or on uniform spans is predicted
  # faster.
  assert rep.schedule_costs in ("measured", "coarse", "uniform")
  assert rep.alternative_ms is not None
  assert rep.alternative_ms >= rep.predicted_step_ms
  # Every candidate's price; the lowered one's is the cheapest and the
  # report's prediction.
  assert "measured" in rep.candidate_ms and len(rep.candidate_ms) >= 2
  assert rep.candidate_ms[rep.schedule_costs] == pytest.approx(
      rep.predicted_step_ms) == min(rep.candidate_ms.values())
  spans = {b.label: b.span for b in step.built.graph.blocks}
  if rep.schedule_costs == "uniform":
    assert rep.quantization_error is None
    assert list(spans.values()) == [1, 1, 2, 2]
  elif rep.schedule_costs == "coarse":  # (spans on the coarser grid)
    assert rep.quantization_error is None
    assert all(s >= 1 for s in spans.values())
  else:
    assert rep.quantization_error >= 0.0
    for label, ms in rep.block_ms.items():
      assert spans[label] == quantize.to_steps(ms * 1e-3,
                                               rep.time_resolution_s)


def test_uniform_cost_is_the_suite_default_and_reports_without_times():
  mesh = jax.make_mesh((2,), ("pipe",))
  fn, params, batch = _tiny(kinds=("embed", "head"))
  step = tj.schedule(fn, mesh=mesh, placement=placements.vshape(2),
                     num_microbatches=4)
  built = step.build(params, batch)
  assert step.report.cost == "uniform" and built.profile is None
  assert step.report.predicted_step_ms is None
  assert [b.span for b in built.graph.blocks] == [1, 1, 2, 2]
  assert step.report.peak_memory_bytes[0] >= 2 * built.layout.bytes_per_device()[0]


def test_memory_limit_counts_optimizer_slots():
  mesh = jax.make_mesh((2,), ("pipe",))
  fn, params, batch = _tiny(kinds=("embed", "head"))
  free = tj.schedule(fn, mesh=mesh, placement=placements.vshape(2),
                     num_microbatches=4)
  built = free.build(params, batch)
  fixed = max(built.layout.bytes_per_device())
  # Enough for params + grads + a generous stash, not with 2 Adam slots.
  limit = 2 * fixed + 64 * built.memory_unit
  ok = tj.schedule(fn, mesh=mesh, placement=placements.vshape(2),
                   num_microbatches=4, memory_limit=limit, recompute=False)
  ok.build(params, batch)
  # less the hoisted values too (the tied head's transposed embedding)
  assert ok.report.hoisted_bytes > 0
  assert ok.report.memory_limit_bytes == (
      limit - 2 * fixed - ok.report.hoisted_bytes)
  short = tj.schedule(fn, mesh=mesh, placement=placements.vshape(2),
                      num_microbatches=4, memory_limit=limit,
                      optimizer_slots=64 * built.memory_unit // fixed + 1,
                      recompute=True)
  with pytest.raises(tj.TesselError, match="optimizer_slots"):
    short.build(params, batch)


@pytest.mark.parametrize("kwargs, match", [
    ({"cost": "fast"}, "cost is 'fast'"),
    ({"time_resolution": 0}, "time_resolution"),
    ({"link": "fiber"}, "link must be"),
    ({"optimizer_slots": -1}, "optimizer_slots"),
])
def test_bad_cost_options_are_clear_errors(kwargs, match):
  mesh = jax.make_mesh((2,), ("pipe",))
  with pytest.raises(tj.TesselError, match=match):
    tj.schedule(lambda p, b: jnp.sum(b), mesh=mesh,
                placement=placements.vshape(2), num_microbatches=2, **kwargs)


def test_a_schedule_in_the_same_order_is_priced_as_the_lowered_one(
    monkeypatch):
  # When the schedule searched on uniform spans orders the blocks as the
  # measured one does, its price is the lowered plan's own, outside and
  # FSDP terms included (it once left out the outside term).
  from tessel_jax import schedule_choice  # pylint: disable=import-outside-toplevel
  monkeypatch.setattr(schedule_choice, "same_order", lambda a, b: True)
  fn, params, batch = _tiny(n=4, kinds=("embed", "head"))
  step = tj.schedule(fn, mesh=jax.make_mesh((2,), ("pipe",)),
                     placement=placements.vshape(2), num_microbatches=4,
                     cost="measured", solver_time_limit_s=10)
  rep = step.build(params, batch).report
  assert rep.schedule_costs == "measured" and rep.outside_ms > 0
  assert rep.alternative_ms == pytest.approx(rep.predicted_step_ms)
  assert set(rep.candidate_ms.values()) == {rep.candidate_ms["measured"]}
  assert rep.candidate_ms["measured"] == pytest.approx(rep.predicted_step_ms)
