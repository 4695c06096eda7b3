"""Test setup: a CPU mesh of 8 fake devices (XLA's backend at -O0 with its
older LLVM IR emitters, compiling faster), configured before jax loads.

XLA reads ``XLA_FLAGS`` and JAX reads ``JAX_PLATFORMS`` once, at import, so
they are set here, before any test module imports jax.
"""

import os

_DEVICE_FLAG = "--xla_force_host_platform_device_count=8"
# XLA's CPU backend (LLVM) at -O0: the suite's time is mostly XLA compiles
# of small programs, which this halves (a 40-block value_and_grad: compile
# 3.8 -> 1.7 CPU s, step 22 -> 39 ms; tests/test_lowering_experiments.py's
# train test 21.5 -> 12.9 CPU s). At -O0 most of what is left is XLA's MLIR
# fusion emitters (a fixed cost per fusion); the older LLVM IR emitters
# compile a lowered step in about half the CPU (test_lowering's vshape(4):
# 2.28 -> 1.18 CPU s, step 22 -> 30 ms; test_lowering + test_placed 149 ->
# 110 CPU s). The tests of HLO text, compiled bytes and numbers pass as at
# the default. TESSEL_JAX_TEST_XLA_OPT=1, or an optimisation level in
# XLA_FLAGS, keeps XLA's defaults. Child processes (examples, README,
# runners: tests/child_env.py) compile with these flags too.
OLDER_EMITTERS = "--xla_cpu_use_fusion_emitters=false"
_FAST_COMPILE = ("--xla_backend_optimization_level=0", OLDER_EMITTERS)


def _xla_knows(flag: str) -> bool:
  """Whether the installed jaxlib's XLA defines ``flag`` (its name is in
  one of jaxlib's shared libraries): XLA aborts on an unknown flag in
  XLA_FLAGS, and a later jaxlib may drop one of ``_FAST_COMPILE``."""
  import glob  # pylint: disable=import-outside-toplevel
  import importlib.util  # pylint: disable=import-outside-toplevel
  import mmap  # pylint: disable=import-outside-toplevel
  spec = importlib.util.find_spec("jaxlib")  # finds it, imports nothing
  if spec is None or spec.origin is None:
    return False
  name = flag.lstrip("-").split("=")[0].encode()
  for path in glob.glob(os.path.join(
      os.path.dirname(spec.origin), "**", "*.so"), recursive=True):
    if not os.path.getsize(path):
      continue
    with open(path, "rb") as lib, mmap.mmap(
        lib.fileno(), 0, access=mmap.ACCESS_READ) as text:
      if text.find(name) >= 0:
        return True
  return False


_flags = os.environ.get("XLA_FLAGS", "").split()
if _DEVICE_FLAG not in _flags:
  _flags.append(_DEVICE_FLAG)
if (os.environ.get("TESSEL_JAX_TEST_XLA_OPT") != "1" and
    not any(f.startswith("--xla_backend_optimization_level") for f in _flags)):
  _flags.extend(f for f in _FAST_COMPILE if _xla_knows(f))
os.environ["XLA_FLAGS"] = " ".join(_flags)
os.environ["JAX_PLATFORMS"] = "cpu"
os.environ.setdefault("MPLBACKEND", "Agg")

# Measured costs (tessel_jax.schedule's default) profile every kernel and
# make schedules depend on timings; the suite runs with uniform spans unless
# a test asks for cost="measured" (tests/test_cost.py). Measurements made
# by such tests go to a per-session temporary cache, not ~/.cache.
os.environ.setdefault("TESSEL_JAX_COST", "uniform")
if "TESSEL_JAX_CACHE" not in os.environ:
  import atexit
  import shutil
  import tempfile

  _CACHE = tempfile.mkdtemp(prefix="tessel_jax_test_cache_")
  os.environ["TESSEL_JAX_CACHE"] = _CACHE
  atexit.register(shutil.rmtree, _CACHE, True)


import pytest  # noqa: E402  (after the environment above)


@pytest.fixture
def no_clock_caps(monkeypatch):
  """Lifts the search's safety nets (CPU seconds: ``search.clock``), so a
  slow run cannot cut a solve short: only the deterministic budgets decide
  the result."""
  from tessel_jax.search import budget, cpsat  # pylint: disable=import-outside-toplevel
  monkeypatch.setattr(cpsat, "_CPU_PER_DETERMINISTIC_S", 1e4)
  init = budget.Budget.__init__

  def no_cap(self, total, **kw):
    init(self, total, **kw)
    self.cap_deadline += 1e6

  monkeypatch.setattr(budget.Budget, "__init__", no_cap)


@pytest.fixture
def measured_first_only(monkeypatch):
  """Measured builds lower the schedule searched on the measured spans,
  searching and pricing no other candidate (``step_schedule.candidates``):
  for tests of what a build measures and caches, not of the choice (tests/test_coarse_candidate.py, test_cost's report test and
  test_program_bytes' FSDP pricing test check that)."""
  from tessel_jax import step_schedule  # pylint: disable=import-outside-toplevel
  monkeypatch.setattr(step_schedule, "candidates", lambda *a, **k: [])


#: Tick microbenchmark figures measured in this worker, by (devices, axis,
#: arguments): see ``shared_tick_costs``.
_TICK_COSTS: dict = {}


@pytest.fixture
def shared_tick_costs(monkeypatch):
  """The tick microbenchmark (``cost.ticks.measure_tick_costs``: two
  compiled toy tick loops timed 3 x 5 times, 2.4-4 CPU s on 2-4 fake
  devices) measured once per worker per mesh and reused by later calls: for
  tests of what a build does with the figures (each test's fresh
  ``cache_dir`` would measure them again), not of the measurement."""
  from tessel_jax.cost import ticks  # pylint: disable=import-outside-toplevel
  real = ticks.measure_tick_costs

  real_prefetch = ticks.prefetch_tick_programs

  def key_of(mesh, axis, kw):
    return (tuple(d.id for d in mesh.devices.flat), mesh.axis_names, axis,
            tuple(sorted(kw.items())))

  def once(mesh, axis="pipe", **kw):
    key = key_of(mesh, axis, kw)
    if key not in _TICK_COSTS:
      _TICK_COSTS[key] = real(mesh, axis, **kw)
    return _TICK_COSTS[key]

  def prefetch(mesh, axis="pipe", **kw):  # nothing to compile for a reuse
    if key_of(mesh, axis, kw) in _TICK_COSTS:
      return []
    return real_prefetch(mesh, axis, **kw)

  monkeypatch.setattr(ticks, "measure_tick_costs", once)
  monkeypatch.setattr(ticks, "prefetch_tick_programs", prefetch)


# Per-test CPU seconds with TESSEL_JAX_TEST_CPU_LOG=PATH (tests/cpu_log.py).
from cpu_log import pytest_runtest_protocol  # noqa: E402,F401  pylint: disable=wrong-import-position,unused-import
