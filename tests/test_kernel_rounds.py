"""A profile's kernels timed interleaved in rounds (``cost.kernel_rounds``).

Timed one after the other, every sample of a kernel falls in the same short
stretch, so a slow stretch of a loaded machine moves that kernel's whole
figure. Interleaved, a stretch slows a few rounds of every kernel and the
median of the round minima drops them.
"""

from __future__ import annotations

import jax

import tessel_jax as tj
from tessel_jax.cost import call_timing, compile_pool, kernel_rounds, measure

import test_lowering_models as M


def _built():
  mesh = jax.make_mesh((2,), ("pipe",))
  kinds = ["embed", "layer", "layer", "head"]
  fn = M.chain_fn(kinds)
  params = M.make_params(M.num_layers(kinds))
  step = tj.schedule(fn, mesh=mesh, placement=tj.Placement([0, 0, 1, 1]),
                     num_microbatches=4, cost="uniform")
  return step.build(params, M.make_batch(16))


def _slow_stretch(monkeypatch, slow: int) -> list[int]:
  """Every timed sample takes 1 ms a call, the first ``slow`` samples of the
  profile 3 ms (a busy neighbour); no call overhead. Returns the counter."""
  count = [0]

  def sample(fn, inner, cpu_clock):
    count[0] += 1
    return 3e-3 if count[0] <= slow else 1e-3
  monkeypatch.setattr(call_timing, "one_sample", sample)
  monkeypatch.setattr(kernel_rounds, "one_sample", sample)
  monkeypatch.setattr(measure, "call_overhead",
                      lambda *a, **k: call_timing.CallOverhead(0.0, 0.0, 0.0))
  return count


def _profile(built, repeats):
  return measure.profile_kernels(
      built.kernels, built.graph, built.partition.traced.param_avals,
      jax.devices()[0], repeats=repeats, warmup=1, memo={},
      part=built.partition)


def test_a_slow_stretch_does_not_move_one_kernel(monkeypatch):
  """A stretch as long as one kernel's samples: timed alone (the old
  timing) the first kernel takes all of it and is profiled 3x; interleaved
  every kernel stays at 1 ms, for as many samples."""
  built = _built()
  repeats = 5
  count = _slow_stretch(monkeypatch, slow=measure.ROUNDS * repeats)
  batches: list[int] = []
  real = compile_pool.compile_all
  monkeypatch.setattr(compile_pool, "compile_all",
                      lambda jobs, workers=None: batches.append(len(jobs))
                      or real(jobs, workers))
  prof = _profile(built, repeats)
  secs = sorted(k.seconds for k in prof.kernels.values())
  assert len({k.key for k in prof.kernels.values()}) >= 3
  assert max(secs) < 1.01e-3, secs
  distinct = prof.measured
  per_kernel = (kernel_rounds.rounds_for(measure.ROUNDS * repeats) *
                kernel_rounds.SAMPLES_PER_ROUND)
  assert count[0] == distinct * per_kernel
  assert batches == [distinct]   # all compiled before the first is timed
  assert measure.ROUNDS * repeats <= per_kernel <= measure.ROUNDS * repeats + 1


def test_switched_off_times_each_kernel_alone(monkeypatch):
  """``TESSEL_JAX_INTERLEAVED_PROFILE=0``: the old timing (the stretch
  lands on one kernel) and the old cache keys."""
  built = _built()
  monkeypatch.setenv(kernel_rounds.ENV, "0")
  _slow_stretch(monkeypatch, slow=measure.ROUNDS * 5)
  prof = _profile(built, 5)
  secs = sorted(k.seconds for k in prof.kernels.values())
  assert secs[-1] > 2.9e-3 and secs[0] < 1.01e-3
  k = next(iter(prof.kernels.values()))
  kernel = built.kernels.kernels[k.block_id]
  avals = built.partition.traced.param_avals
  dev = jax.devices()[0]
  assert k.key == measure.kernel_key(kernel, avals, dev,
                                     built.partition.blocks[kernel.fwd])
  assert k.key != measure.kernel_key(kernel, avals, dev,
                                     built.partition.blocks[kernel.fwd],
                                     interleaved=True)


def test_enabled_reads_the_switch():
  assert kernel_rounds.enabled({})
  assert kernel_rounds.enabled({kernel_rounds.ENV: "1"})
  assert not kernel_rounds.enabled({kernel_rounds.ENV: "0"})
