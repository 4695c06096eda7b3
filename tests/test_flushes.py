"""Deferred remote rounds (passes.flushes): where the lowering writes them."""

from __future__ import annotations

import dataclasses

from passes import flushes


@dataclasses.dataclass(frozen=True)
class _Rd:
  remote: bool
  payload: tuple
  perm: tuple
  due: int = -1


@dataclasses.dataclass(frozen=True)
class _Tick:
  sends: tuple


def _ticks(*sends):
  return [_Tick(tuple(s)) for s in sends]


def test_rounds_wait_for_their_first_reader():
  # Tick 0 sends 0->1 read at tick 2; tick 1 sends 1->0 read at tick 3.
  ticks = _ticks([_Rd(True, (4,), ((0, 1),), due=2)],
                 [_Rd(True, (4,), ((1, 0),), due=3)], [], [])
  got = flushes.remote_flushes(ticks, [0, 1, 2, 3])
  # Both are written together before tick 2 (one rendezvous, not two).
  assert got == [(), (), (0, 1), (), ()]
  assert flushes.barrier_count(ticks, [0, 1, 2, 3]) == 1


def test_undated_and_local_rounds_go_at_the_next_tick():
  ticks = _ticks([_Rd(True, (4,), ((0, 1),))], [_Rd(False, (4,), ())], [])
  assert flushes.remote_flushes(ticks, [0, 1, 2]) == [(), (0,), (), ()]


def test_what_is_pending_is_written_at_the_end():
  ticks = _ticks([_Rd(True, (4,), ((0, 1),), due=9)],
                 [_Rd(True, (4,), ((1, 0),), due=9)])
  assert flushes.remote_flushes(ticks, [0, 1]) == [(), (), (0, 1)]


def test_merge_needs_equal_payloads_and_disjoint_ends():
  a = _Rd(True, (4,), ((0, 1),))
  b = _Rd(True, (4,), ((1, 0),))
  c = _Rd(True, (4,), ((0, 2),))          # sender 0 again
  d = _Rd(True, (8,), ((2, 3),))          # other payload
  e = _Rd(True, (4,), ((2, 1),))          # receiver 1 again
  assert flushes.merge_rounds([a, b, c, d, e]) == [[0, 1], [2, 4], [3]]


def test_1f1b_loop_body_has_one_rendezvous():
  """On vshape(2) the 1F1B period's two messages (F0 -> F1, B1 -> B0) are
  written together after the period's last tick: one collective-permute
  per loop iteration (it was one per message, each splitting the
  devices' work)."""
  # pylint: disable=import-outside-toplevel
  import re

  import jax
  import tessel_jax as tj
  from experiments import lowering_bench_lib as lb
  from tessel_jax import placements
  mesh = jax.make_mesh((2,), ("pipe",),
                       axis_types=(jax.sharding.AxisType.Auto,),
                       devices=jax.devices()[:2])
  fn, params = lb.chain_model(2, 16, 1)
  batch = lb.make_batch(8 * 4, 16)
  step = tj.schedule(fn, mesh=mesh, placement=placements.vshape(2),
                     num_microbatches=8, plan="1f1b", cost="uniform",
                     interpret_ramps=8)  # the loop lowering
  assert "loop(" in step.build(params, batch).plan.loop_summary()
  text = step.lower(params, batch).compile().as_text()
  comps = lb._computations(text)  # pylint: disable=protected-access
  bodies = set(re.findall(r"\bwhile\(.*?body=%([\w.\-]+)", text))
  assert bodies
  per_body = [sum("collective-permute(" in line for line in comps[b])
              for b in bodies]
  assert per_body == [1] * len(bodies)
