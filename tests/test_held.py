"""Held remote rounds of interpreted segments (``passes.held``, ``passes.outbox``).

An interp tick used to send every remote round at every boundary, one
``ppermute`` (a rendezvous of every device on XLA's CPU runtime) between any
two ticks. Now remote messages wait in an outbox until a flush boundary,
at most their reader's tick: the fewest flushes that meet every message's
window. These tests check the window arithmetic, that the compact lowering
of a 2-stage V-shape flushes once per steady period (3 ticks) instead of at
every tick, and that compact programs with held rounds (ring shifts on 4
devices, row-split messages, two towers) still equal
``jax.value_and_grad``.
"""

from __future__ import annotations

import itertools
import random
import re

import jax
import numpy as np
import pytest

import tessel_jax as tj
from experiments import hlo_count
from passes import held

import test_lowering_models as M

TOL = 1e-5


def _covers(points, intervals):
  return all(points[lo:hi + 1].any() for lo, hi in intervals)


def test_flush_points_are_few_and_meet_every_window():
  rng = random.Random(0)
  for _ in range(200):
    b = rng.randint(2, 8)
    intervals = []
    for _ in range(rng.randint(1, 5)):
      lo = rng.randrange(b)
      intervals.append((lo, rng.randint(lo, b - 1)))
    points = held.flush_points(intervals, b)
    assert _covers(points, intervals)
    fewest = min(k for k in range(b + 1)
                 for c in itertools.combinations(range(b), k)
                 if _covers(np.isin(np.arange(b), c), intervals))
    assert points.sum() == fewest


def test_message_waits_for_its_reader_or_the_next_hold():
  # produced at boundary 2, read at tick 6, sender holds again at 5
  assert held.latest_send(2, 6, 5, 10) == 4
  assert held.latest_send(2, 6, None, 10) == 6
  assert held.latest_send(2, 40, None, 10) == 10   # read after the segment
  assert held.latest_send(2, -5, None, 10) == 2    # reader unknown: at once
  points = np.array([0, 0, 0, 1, 0, 1], bool)
  assert held.send_boundary(points, 2) == 3
  assert held.send_boundary(points, 4) == 5
  with pytest.raises(ValueError, match="empty send interval"):
    held.flush_points([(3, 2)], 5)


def _while_parents(text):
  """``{while body: computation holding the while}`` of compiled HLO."""
  comps, _ = hlo_count.computations(text)
  out = {}
  for name, lines in comps.items():
    for line in lines:
      m = re.search(r" while\(.*body=%?([^,\s}]+)", line)
      if m:
        out[m.group(1)] = name
  return comps, out


def _compact(graph, n, fn, params, text=False):
  batch = M.make_batch(n * 4)
  mesh = jax.make_mesh((graph.num_devices,), ("pipe",))
  step = tj.schedule(fn, mesh=mesh, placement=graph, num_microbatches=n,
                     interpret_ramps=0, solver_time_limit_s=20.0)
  loss, grads = step(params, batch)
  ref_loss, ref_grads = M.reference(fn, params, batch, n)
  assert M.max_rel_err(loss, ref_loss) <= TOL
  assert M.max_rel_err(grads, ref_grads) <= TOL
  plan = step.built.plan
  assert {s.kind for s in plan.segments} == {"interp"}
  (spec,) = plan.interps.values()
  if text:
    return spec, step.lower(params, batch).compile().as_text()
  return spec


def test_vshape2_compact_flushes_once_per_period():
  kinds = ["embed", "head"]
  spec, text = _compact(tj.placements.vshape(2), 8, M.chain_fn(kinds),
                        M.make_params(M.num_layers(kinds)), text=True)
  remote = [rd for rd in spec.sends if rd.remote]
  ticks = spec.branch_of.shape[0]
  flushes = np.any([rd.flush[:, 0] for rd in remote], axis=0).sum()
  # F0 then B1 both wait for the [B0 | F1] tick: one rendezvous per period
  # of 3 ticks (every tick before: ``ticks`` of them).
  assert flushes <= ticks // 3 + 2, (flushes, ticks)
  # every device holds each of its messages once, before its flush
  for rd in remote:
    for p, d in zip(*np.nonzero(rd.hold == 0)):
      assert rd.flush[p:, 0].any()
  # Each send sits in its own 0/1-trip loop inside the tick loop (XLA
  # hoisted it into the tick loop's body, at every tick, when its payload
  # did not depend on the trip counter).
  comps, parent = _while_parents(text)
  sends = [name for name, lines in comps.items()
           if any(" collective-permute(" in l for l in lines)]
  in_ticks = [c for c in sends if parent.get(parent.get(c)) is not None]
  assert in_ticks, sends


@pytest.mark.parametrize("graph", [tj.placements.vshape(4),
                                   tj.placements.mshape(4),
                                   tj.placements.xshape(4)],
                         ids=lambda g: g.name)
def test_compact_with_held_rounds_matches_value_and_grad(graph):
  n_fwd = sum(1 for b in graph.blocks if b.kind == "F")
  if graph.name.startswith("xshape"):
    per = n_fwd // 2
    fn, params = M.two_tower_fn(per), M.make_params(2 * (per - 1))
  else:
    kinds = ["embed"] + ["layer"] * (n_fwd - 2) + ["head"]
    fn, params = M.chain_fn(kinds), M.make_params(M.num_layers(kinds))
  spec = _compact(graph, 8, fn, params)
  ticks = spec.branch_of.shape[0]
  flushes = np.any([rd.flush[:, 0] for rd in spec.sends if rd.remote],
                   axis=0).sum()
  assert flushes < ticks


def test_each_message_is_written_by_the_kernel_that_made_it():
  """``passes.kernel_sends``: at every boundary a device writes only the
  rounds its kernel of the tick before made, each real message once."""
  from passes import kernel_sends  # pylint: disable=import-outside-toplevel
  kinds = ["embed", "head"]
  graph = tj.placements.vshape(2)
  fn, params = M.chain_fn(kinds), M.make_params(M.num_layers(kinds))
  batch = M.make_batch(8 * 4)
  mesh = jax.make_mesh((2,), ("pipe",))
  step = tj.schedule(fn, mesh=mesh, placement=graph, num_microbatches=8,
                     interpret_ramps=0, solver_time_limit_s=20.0)
  plan = step.build(params, batch).plan
  (spec,) = plan.interps.values()
  sinks = [p.slots for p in plan.pools]
  assert kernel_sends.writes_in_kernels(spec, sinks)
  written = {}
  for b, kid in enumerate(spec.branches):
    if kid is None:
      continue
    ran = np.zeros((spec.branch_of.shape[0] + 1, 2), bool)
    ran[1:] = spec.branch_of == b
    for ks in kernel_sends.kernel_sends(spec, kid, b, sinks):
      rd = spec.sends[ks.round]
      assert set(ks.ports) <= set(spec.out_map[kid])
      for p, d in zip(*np.nonzero(ran)):
        real = (rd.hold[p, d] == 0 if rd.remote else
                any(tg.slot.base[p, d] != sinks[tg.pool]
                    for tg in rd.targets))
        if real:
          assert (ks.round, p, d) not in written
          written[(ks.round, p, d)] = kid
  for i, rd in enumerate(spec.sends):
    for p, d in np.ndindex(rd.cand.shape):
      real = (rd.hold[p, d] == 0 if rd.remote else
              any(tg.slot.base[p, d] != sinks[tg.pool] for tg in rd.targets))
      assert real == ((i, p, d) in written)
  assert {spec.sends[i].remote for i, _, _ in written} == {True, False}


def _tick_body_outbox_writes(text, payload):
  """Instructions of the shape of an outbox of ``payload`` in the bodies
  of the loops that hold a flush loop (an interp segment's tick loop)."""
  comps, parent = _while_parents(text)
  flushes = [name for name, lines in comps.items()
             if any(" collective-permute(" in l for l in lines)]
  bodies = {parent[c] for c in flushes if c in parent}
  shape = "[" + ",".join(str(s) for s in (2,) + tuple(payload)) + "]"
  return sum(1 for b in bodies for l in comps[b]
             if re.search(r"= f32" + re.escape(shape) + r"\{", l)
             and ("fusion(" in l or "dynamic-update-slice(" in l))


def test_held_messages_copied_by_the_kernels_that_made_them():
  """``Switches.held_in_kernels``: the tick loop of a compact zbv(4) no
  longer copies every device's payload into every remote round's outbox
  at every boundary (the kernels' loops copy the messages they made), and
  the program still equals ``jax.value_and_grad``."""
  from tessel_jax.passes.switches import Switches  # pylint: disable=import-outside-toplevel
  graph = tj.placements.zbv(4)
  kinds = ["embed"] + ["layer"] * 6 + ["head"]
  fn, params = M.chain_fn(kinds), M.make_params(M.num_layers(kinds))
  n = 8
  batch = M.make_batch(n * 4)
  mesh = jax.make_mesh((4,), ("pipe",))
  ref_loss, ref_grads = M.reference(fn, params, batch, n)
  writes, sent, sched = {}, {}, None
  for on in (False, True):
    step = tj.schedule(fn, mesh=mesh, placement=graph, num_microbatches=n,
                       interpret_ramps=0, solver_time_limit_s=20.0,
                       plan=sched, switches=Switches(held_in_kernels=on))
    loss, grads = step(params, batch)
    assert M.max_rel_err(loss, ref_loss) <= TOL
    assert M.max_rel_err(grads, ref_grads) <= TOL
    sched = step.built.unrolled
    (spec,) = step.built.plan.interps.values()
    payloads = {rd.payload.shape for rd in spec.sends if rd.remote}
    text = step.lower(params, batch).compile().as_text()
    writes[on] = sum(_tick_body_outbox_writes(text, p) for p in payloads)
    sent[on] = [l for l in text.splitlines()
                if " collective-permute(" in l and "tj_ppermute" in l]
  assert writes[False] >= 1, writes
  assert writes[True] == 0, writes
  # Outboxes only kernels making a message write have no sink slot and are
  # sent as they are, not copied out of a slot (dynamic-slice) first.
  assert sent[False] and all("dynamic-slice" in l for l in sent[False])
  assert sent[True] and not any("dynamic-slice" in l for l in sent[True])


def test_held_in_kernels_is_the_default_and_the_environment_turns_it_off():
  from tessel_jax.passes import switches  # pylint: disable=import-outside-toplevel
  assert switches.Switches().held_in_kernels
  assert switches.from_env({}).held_in_kernels
  assert not switches.from_env(
      {switches.HELD_IN_KERNELS_ENV: "0"}).held_in_kernels
