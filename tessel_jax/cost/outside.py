"""What a step pays outside its ticks, measured once per program shape.

Before its first tick a lowered training step packs the parameters into
per-device buffers, and after its last it gathers the packed gradients over
the pipe axis and unpacks them (``passes.outside``). Both run once per step,
serially with the ticks, and the replay of the ticks (``predict``) does not
see them: on the README GPT (``experiments.tp_bench``, 4 CPU devices on 2
cores, real-time priority) they took 2.8 ms of pipe2_model2's 17.1 ms step,
6.9 of pipe2_model2_replicated's 33.7, 7.1 of pipe2_data2_model2's 26.0 and
7.3 of pipe4's 30.4.

:func:`cached_outside_seconds` compiles that program alone and times it,
cached on disk by its jaxpr (the layout, the mesh and the shapes decide
it) and the machine's fields. On the CPU backend a sample is the smaller of
its wall time and the process's CPU time over the cores the devices can
use (the program's devices copy in parallel): a loaded machine does not
inflate the figure.
"""

from __future__ import annotations

import dataclasses
import hashlib
import re
import statistics
import time
from collections.abc import Callable, Mapping
from typing import Any

from tessel_jax.cost import compile_pool as _compile_pool

#: Bump when what the outside program covers changes (cache key).
OUTSIDE_VERSION = 1


def time_outside(run: Callable[[], Any], parallel: float | None,
                 repeats: int = 7, rounds: int = 2) -> float:
  """Seconds of one call of ``run`` (compiled): the smallest of ``rounds``
  medians of ``repeats`` samples. With ``parallel`` (CPU backend: the
  cores the program's devices can use) a sample is ``min(wall, CPU time /
  parallel)``."""
  import jax  # pylint: disable=import-outside-toplevel
  _compile_pool.drain()  # no background compile while timing
  jax.block_until_ready(run())
  medians = []
  for _ in range(max(1, rounds)):
    samples = []
    for _ in range(max(1, repeats)):
      c0, t0 = time.process_time(), time.perf_counter()
      jax.block_until_ready(run())
      wall = time.perf_counter() - t0
      if parallel:
        wall = min(wall, (time.process_time() - c0) / parallel)
      samples.append(wall)
    medians.append(statistics.median(samples))
  return min(medians)


@dataclasses.dataclass(frozen=True)
class OutsideTimer:
  """The outside program of one layout, to time.

  Attributes:
    signature: Its jaxpr text (the cache key's heart).
    measure: ``() -> seconds``: compiles it (or takes it compiled ahead,
      :meth:`prefetch`) and times it (:func:`time_outside`).
    prepare: ``() -> run``: compiles it; ``run()`` calls it once.
    key: Its background-compile key (``compile_pool.BACKGROUND``).
  """

  signature: str
  measure: Callable[[], float]
  prepare: Callable[[], Callable[[], Any]]
  key: str

  def prefetch(self) -> str:
    """Compiles the program on the background compile thread, for
    :attr:`measure` to take; returns its key."""
    _compile_pool.BACKGROUND.call(self.key, self.prepare)
    return self.key


def outside_timer(program: Callable[[Any], Any], params: Any, mesh: Any,
                  parallel: float | None) -> OutsideTimer:
  """The :class:`OutsideTimer` of the outside program ``program(params)``,
  run on zeros of ``params``' shapes, placed as ``params`` are on ``mesh``
  (replicated where they are not)."""
  import jax  # pylint: disable=import-outside-toplevel
  import numpy as np  # pylint: disable=import-outside-toplevel
  from jax.sharding import NamedSharding, PartitionSpec  # pylint: disable=import-outside-toplevel

  from tessel_jax import compat  # pylint: disable=import-outside-toplevel

  def placed(x: Any) -> Any:
    sh = getattr(x, "sharding", None)
    if not (isinstance(sh, NamedSharding) and
            sh.mesh.devices.shape == mesh.devices.shape):
      sh = NamedSharding(mesh, PartitionSpec())
    return jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=sh)

  avals = jax.tree_util.tree_map(placed, params)
  text = compat.plain_text(jax.make_jaxpr(program)(avals))
  text = re.sub(r" at 0x[0-9a-f]+", "", text)

  key = ("outside:" + hashlib.sha256(text.encode()).hexdigest() +
         f":{tuple(int(d.id) for d in mesh.devices.flat)}")

  def prepare() -> Callable[[], Any]:
    zeros = jax.tree_util.tree_map(
        # numpy zeros: jnp.zeros compiled a program per shape.
        lambda a: jax.device_put(np.zeros(a.shape, a.dtype), a.sharding),
        avals)
    compiled = jax.jit(program).lower(zeros).compile()
    return lambda: compiled(zeros)

  def measure() -> float:
    run = _compile_pool.BACKGROUND.take_call(key)
    return time_outside(run if run is not None else prepare(), parallel)

  return OutsideTimer(text, measure, prepare, key)


def cached_outside_seconds(cache: Any, fields: Mapping[str, Any],
                           signature: str, measure: Callable[[], float]
                           ) -> tuple[float, bool]:
  """``(seconds, from the cache?)`` of the outside program ``signature``
  on the machine described by ``fields``."""
  key = outside_cache_key(fields, signature)
  rec = cache.get("outside", key)
  if rec is not None:
    return float(rec["outside_s"]), True
  sec = float(measure())
  cache.put("outside", key, {"outside_s": sec})
  return sec, False


def outside_cache_key(fields: Mapping[str, Any], signature: str) -> str:
  """The on-disk cache key (kind ``"outside"``) of the outside program
  ``signature`` on the machine ``fields`` describes."""
  from tessel_jax.cost.cache import make_key  # pylint: disable=import-outside-toplevel
  return make_key({"what": "outside", "version": OUTSIDE_VERSION, **fields,
                   "program": signature})


def layout_timer(mesh: Any, pipe_axis: str, data_axes: Any, traced: Any,
                 params: Any) -> Callable[[Any], Any]:
  """``layout ->`` :class:`OutsideTimer` of the outside program of a build
  (``passes.outside`` on ``mesh`` with all axes Auto), for
  ``CostModel.time_outside``; ``None`` for every layout where the program
  wraps stacked leaves stored as slices (not priced). One timer per layout
  object: the build prices several schedules of one layout, and tracing
  the program for its signature took ~0.1 s each time (README GPT)."""
  # pylint: disable=import-outside-toplevel
  from tessel_jax import compat
  from tessel_jax.cost.call_timing import cpu_cores
  try:  # installed: passes/ is tessel_jax.passes
    from tessel_jax.passes import outside as _program  # type: ignore
  except ImportError:  # run from the repository root
    from passes import outside as _program  # type: ignore
  devices = int(mesh.devices.size)
  parallel = (float(min(cpu_cores(), devices))
              if mesh.devices.flat[0].platform == "cpu" else None)
  auto = compat.auto_mesh(mesh)

  made: dict[int, tuple[Any, OutsideTimer]] = {}

  def timer(layout: Any) -> Any:
    if getattr(traced, "leaf_split", None) is not None:
      return None
    if id(layout) not in made:  # the layout kept: its id stays its own
      program = _program.outside_program(layout, auto, pipe_axis,
                                         tuple(data_axes), traced.param_avals)
      made[id(layout)] = (layout, outside_timer(program, params, mesh,
                                                parallel))
    return made[id(layout)][1]

  return timer
