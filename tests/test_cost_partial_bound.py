"""A plan's profile stopped at its bound (``cost.search_costs``).

A full build whose measured lower bound prunes it (``plans`` sets
``step.price_bound``) used to compile and time every kernel first; the
bound is now also checked on the kernels profiled so far before each
further kernel is compiled (those not profiled count 0 s: still a lower
bound), so the plan stops there. These tests count kernels compiled and
timed, not seconds.
"""

from __future__ import annotations

import jax
import pytest

import tessel_jax as tj
from tessel_jax import plans as P
from tessel_jax.cost import compile_pool, grouped, measure, search_costs

import test_lowering_models as M

KINDS = ["embed", "layer", "layer", "head"]


def _counted(monkeypatch) -> dict[str, int]:
  """Kernels compiled and timed (timing stubbed: 1 ms a call), one kernel
  compiled at a time, each its own program (``cost.grouped`` off: see
  ``test_a_bounded_group_holds_no_more_than_the_lookahead`` for it on)."""
  monkeypatch.setenv(grouped.ENV, "0")
  counts = {"compiled": 0, "timed": 0}
  monkeypatch.setattr(compile_pool, "WORKERS", 1)
  monkeypatch.setattr(compile_pool, "AHEAD", 1)
  real_compile = compile_pool._compile_one  # pylint: disable=protected-access

  def compiled(job):
    counts["compiled"] += 1
    return real_compile(job)
  monkeypatch.setattr(compile_pool, "_compile_one", compiled)
  real_time = measure.time_kernel

  def timed(*a, **k):
    counts["timed"] += 1
    return real_time(*a, **k)
  monkeypatch.setattr(measure, "time_kernel", timed)
  monkeypatch.setattr(measure, "time_calls",
                      lambda fn, repeats, warmup, cpu_clock=False: (1e-3, 1))
  return counts


def _step(memo: dict, cache_dir) -> object:
  """A measured 2-device chain whose plan any positive bound prunes (its
  measurements cached in ``cache_dir``)."""
  step = tj.schedule(M.chain_fn(KINDS), mesh=jax.make_mesh((2,), ("pipe",)),
                     placement=tj.Placement([0, 0, 1, 1]),
                     num_microbatches=4, cost="measured", cache_dir=str(cache_dir))
  step._costs.memo.kernels = memo  # pylint: disable=protected-access
  seen: list[float] = []

  def bound(costs, n_local):
    ms = P.step_lower_bound(costs, n_local) * 1e3
    seen.append(ms)
    if ms > 0:
      raise P.Pruned(f"lower bound {ms:.3f} ms >= 0 ms")
  step.price_bound = bound
  step.bounds_seen = seen
  return step


def _build_pruned(step) -> None:
  with pytest.raises(P.Pruned, match="lower bound"):
    step.build(M.make_params(M.num_layers(KINDS)), M.make_batch(16))


def _pruned_build(monkeypatch, tmp_path, partial: str):
  """Counts, memo and step of a pruned build with the partial bound on
  (``"1"``) or off (``"0"``)."""
  counts = _counted(monkeypatch)
  monkeypatch.setenv(search_costs.PARTIAL_BOUND_ENV, partial)
  memo: dict = {}
  step = _step(memo, tmp_path)
  _build_pruned(step)
  return counts, memo, step


def test_a_pruned_plan_stops_after_its_first_kernel(monkeypatch, tmp_path):
  counts, memo, step = _pruned_build(monkeypatch, tmp_path, "1")
  # The first kernel alone prices the plan above its bound: nothing else
  # is compiled or timed; what was measured stays for other plans.
  assert counts == {"compiled": 1, "timed": 1}
  assert len(memo) == 1
  assert step.bounds_seen[0] == 0.0 and step.bounds_seen[-1] > 0


def test_the_old_path_profiles_every_kernel_first(monkeypatch, tmp_path):
  counts, memo, step = _pruned_build(monkeypatch, tmp_path, "0")
  assert counts["compiled"] == counts["timed"] == len(memo) > 2
  assert len(step.bounds_seen) == 1   # once, after the whole profile


def test_kernels_known_already_are_priced_before_any_compile(monkeypatch,
                                                            tmp_path):
  """A second plan sharing the kernels measured by the first is bounded
  on them before it compiles anything."""
  counts = _counted(monkeypatch)
  monkeypatch.setenv(search_costs.PARTIAL_BOUND_ENV, "1")
  memo: dict = {}
  _build_pruned(_step(memo, tmp_path / "a"))
  counts.update(compiled=0, timed=0)
  _build_pruned(_step(memo, tmp_path / "b"))
  assert counts == {"compiled": 0, "timed": 0}


def test_the_partial_bound_never_exceeds_the_full_one(monkeypatch, tmp_path):
  """Every partial bound is at most the bound on the whole profile (a
  kernel not profiled yet counts 0 s), so it prunes no plan the full
  bound would keep."""
  _counted(monkeypatch)
  monkeypatch.setenv(search_costs.PARTIAL_BOUND_ENV, "1")
  step = _step({}, tmp_path)
  seen = step.bounds_seen
  step.price_bound = lambda costs, n: seen.append(
      P.step_lower_bound(costs, n) * 1e3)
  step.build(M.make_params(M.num_layers(KINDS)), M.make_batch(16))
  assert len(seen) > 2
  assert seen == sorted(seen) and seen[-1] > seen[0] == 0.0


def test_before_measure_sees_the_known_kernels_by_block(monkeypatch):
  _counted(monkeypatch)
  built = M.uniform_chain_build(KINDS, [0, 0, 1, 1])
  calls: list[set[int]] = []
  measure.profile_kernels(
      built.kernels, built.graph, built.partition.traced.param_avals,
      jax.devices()[0], repeats=1, warmup=1, memo={}, part=built.partition,
      before_measure=lambda known: calls.append(set(known)))
  distinct = len({measure.kernel_key(k, built.partition.traced.param_avals,
                                     jax.devices()[0],
                                     built.partition.blocks[k.fwd])
                  for k in built.kernels.kernels.values()})
  assert len(calls) == distinct and calls[0] == set()
  assert all(a < b for a, b in zip(calls, calls[1:]))


def test_the_switch_refuses_other_values(monkeypatch):
  monkeypatch.setenv(search_costs.PARTIAL_BOUND_ENV, "yes")
  with pytest.raises(ValueError, match="TESSEL_JAX_PARTIAL_BOUND"):
    search_costs.partial_bound_enabled()
  monkeypatch.delenv(search_costs.PARTIAL_BOUND_ENV)
  assert search_costs.partial_bound_enabled()


@pytest.mark.parametrize("lookahead,compiled", [("0", 4), ("1", 1)])
def test_kernels_compiled_ahead_of_a_bound(monkeypatch, tmp_path, lookahead,
                                           compiled):
  """With ``compile_pool.AHEAD`` = 4 a plan stopped after its first kernel
  has compiled four; with ``TESSEL_JAX_BOUND_LOOKAHEAD=1`` one."""
  counts = _counted(monkeypatch)
  monkeypatch.setattr(compile_pool, "AHEAD", 4)
  monkeypatch.setenv(search_costs.PARTIAL_BOUND_ENV, "1")
  monkeypatch.setenv(measure.BOUND_LOOKAHEAD_ENV, lookahead)
  _build_pruned(_step({}, tmp_path))
  assert counts == {"compiled": compiled, "timed": 1}


@pytest.mark.parametrize("ahead", [2, 3])
def test_a_bounded_group_holds_no_more_than_the_lookahead(monkeypatch,
                                                          tmp_path, ahead):
  # cost.grouped on: a profile a bound may stop compiles its kernels in
  # groups of the one-by-one path's lookahead, not all at once.
  monkeypatch.setenv(grouped.ENV, "1")
  monkeypatch.setenv(search_costs.PARTIAL_BOUND_ENV, "1")
  monkeypatch.setattr(compile_pool, "WORKERS", 1)
  monkeypatch.setattr(compile_pool, "AHEAD", ahead)
  monkeypatch.setattr(measure, "time_calls",
                      lambda fn, repeats, warmup, cpu_clock=False: (1e-3, 1))
  sizes: list[int] = []
  real = grouped.compile_group

  def counted(kernels, *a, **k):
    sizes.append(len(kernels))
    return real(kernels, *a, **k)
  monkeypatch.setattr(grouped, "compile_group", counted)
  _build_pruned(_step({}, tmp_path))
  assert sizes == [ahead]
