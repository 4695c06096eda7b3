"""Several kernels compiled as one program, each timed in its own branch.

``measure.profile_kernels`` compiled every kernel it measures as a program
of its own (``measure.lower_kernel``): on the README GPT's main job 6
compiles, ~85% of the profile's CPU. XLA's CPU backend compiles identical
fused computations of one module once, and pays its fixed per-compile work
once: the same 6 kernels as the branches of one ``lax.switch`` were lowered
and compiled in 3.4-4.3 CPU s against 7.7-8.3 s one by one (session 42,
helper prof1, load 4-9; BENCHMARKS.md "The kernel profile's cost").
On by default since session 43 (``TESSEL_JAX_PROFILE_GROUPED=0`` turns it
off). Session 42's quiet re-measure saw the README main job step at
183-241 ms built with it against 119-121 ms without; session 43 (helper
prof2, BENCHMARKS.md "The grouped kernel profile's slow step") found the
same program either way (the schedule built on either profile's prices
compiles to identical HLO), nothing the group leaves in the process (no
thread, affinity, executable or allocation state; per-step CPU, context
switches and page faults alike) and, timed at ``SCHED_RR`` priority after
a cold build, 106/121/116 ms with it against 110/120/123 ms without
(alternated, 3 rounds), while its profile took 7.7-9.7 CPU s against
11.4-14.4 s. ``experiments.train`` now records each step's process CPU
and the host's steal, which tell such a run from a slower program. Its
prices of the forward kernels are lower (0.69-0.75x the alone ones at
``SCHED_RR``; backward 0.97x): the alone call allocates its outputs, which
the program's stash slots do not.

With :data:`ENV` on, :func:`compile_group` lowers the kernels as one
program ``g(args, index)``: branch ``i`` runs kernel ``i`` as the ticks run
it (in a branch, its hoisted values given: ``cost.tick_kernel``), its
outputs materialised behind an ``optimization_barrier`` and one scalar
read from them returned; the last branch runs nothing (the *empty*
call). No branch returns or fills another kernel's outputs, so a call
runs one kernel's work and a scalar. A :class:`Member` stands in for one
kernel's compiled program in ``measure.time_kernel``: calling it runs its
branch, and its figure is its branch's time less the empty call's
(:meth:`Member.empty_call`: the call and its arrays cancelled by the twin,
as ``cost.fused_grads`` does), not ``call_timing.call_overhead``. Its
temp bytes are the group's (an upper bound: XLA gives no per-branch
figure).
"""

from __future__ import annotations

import os
import time
from collections.abc import Mapping, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from tessel_jax import compat
from tessel_jax.cost import compile_pool as _compile_pool
from tessel_jax.cost import tick_kernel as _tick_kernel
from tessel_jax.cost.call_timing import example_array
from tessel_jax.cost.flops import eqns_flops

try:  # installed: passes/ is tessel_jax.passes
  from tessel_jax.passes import param_only as _po  # type: ignore
except ImportError:  # run from the repository root
  from passes import param_only as _po  # type: ignore

#: ``TESSEL_JAX_PROFILE_GROUPED`` (default on; ``0`` turns it off) compiles
#: the kernels a profile measures together, one program
#: (:func:`compile_group`).
ENV = "TESSEL_JAX_PROFILE_GROUPED"
#: Most kernels compiled in one program.
MAX_KERNELS = 16


def enabled(environ: Mapping[str, str] | None = None) -> bool:
  """Whether :data:`ENV` turns the grouped compile on."""
  env = os.environ if environ is None else environ
  return env.get(ENV, "1") not in ("", "0")


class _Program:
  """The compiled group with its example values."""

  def __init__(self, compiled: Any, args: Any, device: Any, branches: int):
    self.compiled, self.args = compiled, args
    self.index = [jax.device_put(np.int32(i), device)
                  for i in range(branches)]

  def run(self, branch: int) -> Any:
    """Runs ``branch`` once (asynchronously); its scalar."""
    return self.compiled(self.args, self.index[branch])


class Member:
  """One kernel of a group, called as ``measure.time_kernel`` calls a
  kernel's compiled program (``member(pv, dv)``: the example values are
  the group's own)."""

  def __init__(self, program: _Program, branch: int, empty: int):
    self._program, self._branch, self._empty = program, branch, empty

  def __call__(self, pv: Any, dv: Any) -> Any:
    del pv, dv  # the group's own example values
    return self._program.run(self._branch)

  def empty_call(self) -> Any:
    """The same call with no kernel run."""
    return self._program.run(self._empty)

  def memory_analysis(self) -> Any:
    """The group's (its temp bytes: an upper bound of the kernel's)."""
    return self._program.compiled.memory_analysis()


def _example(kernel: Any, param_avals: Sequence[Any], device: Any,
             hoist: bool, seed: int) -> tuple[Any, list[Any], list[Any]]:
  """``(traced kernel, parameters, inputs + hoisted values)`` as
  ``measure.lower_kernel`` makes them (without the branch flag)."""
  p = [jax.ShapeDtypeStruct(tuple(param_avals[l].shape), param_avals[l].dtype)
       for l in kernel.params]
  d = [jax.ShapeDtypeStruct(tuple(a.shape), a.dtype) for a in kernel.in_avals]
  rng = np.random.default_rng(seed)
  pv = [jax.device_put(example_array(a, rng), device) for a in p]
  dv = [jax.device_put(example_array(a, rng), device) for a in d]
  f = _tick_kernel.traced(kernel, p, d, hoist)
  hv = _tick_kernel.example_inputs(f, p, device, rng)[:-1]
  return f, pv, dv + hv


def _element(x: Any) -> Any:
  """One element of ``x`` as a float32 scalar (0 when it has none)."""
  flat = x.reshape(-1)
  one = flat[0] if flat.shape[0] else jnp.zeros((), x.dtype)
  return one.astype(np.float32)


def _group_fn(found: Sequence[Any], inputs: Sequence[int]) -> Any:
  """``g(args, index)``: branch ``i`` runs ``found[i]`` (its first
  ``inputs[i]`` values are the kernel's inputs, the rest its hoisted
  values) and returns one scalar read from its outputs; the last branch
  runs nothing."""

  def branch(i: int) -> Any:
    def run(args: Any) -> Any:
      pv, dv = args[i]
      n = inputs[i]
      outs = _po.rest(found[i], list(pv) + list(dv[:n]), list(dv[n:]))
      outs = jax.lax.optimization_barrier(list(outs))
      return sum((_element(o) for o in outs), np.float32(0))
    return run

  def g(args: Any, index: Any) -> Any:
    return jax.lax.switch(index, [branch(i) for i in range(len(found))] +
                          [lambda args: np.float32(0)], args)
  return g


def _kernel_flops(branch: Any) -> float | None:
  """Flops of a branch's kernel: its equations before the last
  ``optimization_barrier`` (the group's; a kernel's own, e.g. from a
  rematerialisation, comes before it). The scalar read after it is the
  group's, not the kernel's: counted, F0 of a small chain came to 137
  flops against 134 alone (``measure.lower_kernel``)."""
  eqns = compat.jaxpr_eqns(branch)
  barriers = [i for i, e in enumerate(eqns)
              if compat.primitive_name(e) == "optimization_barrier"]
  return eqns_flops(eqns[:barriers[-1]] if barriers else eqns)


def _branch_flops(traced: Any, branches: int) -> list[float | None]:
  """Flops of each kernel's branch (its kernel only), counted on the
  traced switch."""
  for eqn in compat.jaxpr_eqns(traced.jaxpr):
    subs = compat.sub_jaxprs(eqn)
    if compat.primitive_name(eqn) == "cond" and len(subs) == branches + 1:
      return [_kernel_flops(s) for s in subs[:branches]]
  return [None] * branches


def compile_group(kernels: Sequence[Any], param_avals: Sequence[Any],
                  device: Any, hoist: Sequence[bool], seed: int = 0
                  ) -> list[_compile_pool.Prepared]:
  """``kernels`` (one device, no fused gradients) lowered and compiled as
  one program; one ``Prepared`` each, its ``compiled`` a :class:`Member`
  (``compile_seconds``: the group's, shared equally)."""
  t0 = time.perf_counter()
  examples = [_example(k, param_avals, device, h, seed)
              for k, h in zip(kernels, hoist)]
  found = [e[0] for e in examples]
  args = [(e[1], e[2]) for e in examples]
  fn = _group_fn(found, [len(k.in_avals) for k in kernels])
  index = jax.device_put(np.int32(len(kernels)), device)
  traced = jax.jit(fn).trace(args, index)
  compiled = traced.lower().compile()
  program = _Program(compiled, args, device, len(kernels) + 1)
  seconds = (time.perf_counter() - t0) / len(kernels)
  return [_compile_pool.Prepared(Member(program, i, len(kernels)), pv, dv,
                                 flops, seconds)
          for i, ((pv, dv), flops) in enumerate(
              zip(args, _branch_flops(traced, len(kernels))))]
