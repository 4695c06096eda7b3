"""A kernel timed per run inside a loop (``experiments.looped_time``, the zoo
runner's diagnostic column): the loop runs the kernel every trip and the
slope over two trip counts leaves out what the call costs. Timings are
replaced by a fixed law here: the arithmetic and the wiring are checked,
not the machine."""

from __future__ import annotations

import re

import jax
import jax.numpy as jnp
import numpy as np

from experiments import looped_time
from tessel_jax.cost import call_timing, measure

from test_measure_overhead import _kernels


def _inputs(k, avals):
  p, d = measure.kernel_avals(k, avals)
  rng = np.random.default_rng(0)
  return ([jnp.asarray(call_timing.example_array(a, rng)) for a in p],  # pylint: disable=protected-access
          [jnp.asarray(call_timing.example_array(a, rng)) for a in d])  # pylint: disable=protected-access


def _ops(hlo: str, header: str) -> int:
  """Instructions of the computation of ``hlo`` whose first line starts
  with ``header``, beyond parameter, tuple, element and constant reads."""
  lines = hlo.splitlines()
  start = next(i for i, l in enumerate(lines) if l.startswith(header))
  end = next(i for i in range(start, len(lines)) if lines[i] == "}")
  plain = ("parameter(", "get-tuple-element(", "tuple(", "constant(")
  return sum(1 for l in lines[start + 1:end]
             if "=" in l and not any(p in l for p in plain))


def test_the_loop_returns_the_kernels_outputs_and_runs_it_every_trip():
  kernels, avals = _kernels()
  for k in kernels.values():
    fn = measure.kernel_callable(k)
    pv, dv = _inputs(k, avals)
    want = jax.jit(fn)(pv, dv)
    got = jax.jit(looped_time.looped(fn))(pv, dv, jnp.asarray(3, jnp.int32))
    for a, b in zip(jax.tree.leaves(want), jax.tree.leaves(got)):
      np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-6)
    # The run stays inside the loop: the while body holds every operation
    # of the kernel compiled alone (without the barrier XLA hoists the
    # loop-invariant work out).
    hlo = jax.jit(looped_time.looped(fn)).lower(
        pv, dv, jnp.asarray(1, jnp.int32)).compile().as_text()
    alone = jax.jit(fn).lower(pv, dv).compile().as_text()
    # The timing loop's while (op_name jit(run)/while); XLA may lower a
    # scatter to a while of its own (its older emitters do).
    (body,) = re.findall(
        r' while\(.*body=(%[\w.\-]+), metadata=\{op_name="jit\(run\)/while"',
        hlo)
    assert _ops(hlo, body + " ") >= _ops(alone, "ENTRY"), k.label


def test_a_run_is_priced_by_the_slope_whatever_the_call_costs():
  # One call costs 0.2 ms however many runs it holds, each run 1 ms; a
  # neighbour slows every third sample by 5 ms: the fastest samples of
  # each trip count give 1 ms per run.
  calls = []

  def law(compiled, pvals, dvals, trips, cpu_clock):
    calls.append(int(trips))
    slow = 5e-3 if len(calls) % 3 == 0 else 0.0
    return 2e-4 + 1e-3 * int(trips) + slow

  per_run = looped_time.slope_seconds(lambda p, d, t: t, [], [], repeats=5,
                                      warmup=1, cpu_clock=True, sample=law)
  assert abs(per_run - 1e-3) < 1e-12
  assert set(calls) == {1, 1 + looped_time.LOOP_RUNS}


def test_thunks_counted_on_the_entry_computation_only():
  # fusion, copy, dot, copy, fusion run; parameters, the fusions' bodies
  # and the output tuple do not.
  f = lambda x, y: (jnp.tanh(x @ y).sum(0), x * 2, (x, y))
  x = jnp.ones((4, 4))
  hlo = jax.jit(f).lower(x, x).compile().as_text()
  assert looped_time.thunk_count(hlo) == _ops(hlo, "ENTRY") - hlo.count(
      " bitcast(") == 5


def test_a_kernel_compiled_alone_counts_its_thunks():
  kernels, avals = _kernels()
  device = jax.devices()[0]
  for k in kernels.values():
    pv, dv = _inputs(k, avals)
    alone = jax.jit(measure.kernel_callable(k)).lower(pv, dv).compile()
    n = looped_time.kernel_thunks(k, avals, device)
    assert n == looped_time.thunk_count(alone.as_text()) > 0, k.label


def test_thunk_count_names_what_it_needs():
  try:
    looped_time.thunk_count("HloModule m\n")
  except ValueError as err:
    assert "compiled.as_text()" in str(err)
  else:
    raise AssertionError("no error for a text without ENTRY")
