"""What a lowered step pays per byte of its stash, beyond the kernels.

Every step of a lowered program creates its stash arrays (a slot per
micro-batch held; ``broadcast`` of zeros in the compiled HLO, outside the
tick loop) and works in them: a schedule holding more micro-batches at once
(GPipe) pays for more bytes each step, whatever its kernels and ticks.
Neither the kernel profiles nor the tick model see it; a plan's own
stand-in program does (``calibrate``), but a classic schedule priced on a
searched plan's build (``plan_pricing.baseline_price``) inherits the
searched plan's stand-in, hence its stash.

:func:`measure_seconds_per_byte` times that cost on a calibration program
of its own: the same kernels and stash traffic (each slot written, then
read back) with a stash of 1 slot or of ``slots`` slots. README GPT, vshape
pipe2 x dp2 (BENCHMARKS.md, helper "pick3", session 32): GPipe's stash is
3.2 MB (N = 8) and 9.2 MB (N = 16) above 1F1B's per device; it measured
4-11% more CPU than priced.
"""

from __future__ import annotations

import statistics
import time

from tessel_jax.cost import compile_pool as _compile_pool

_MEMO: dict[tuple[int, int, int], float] = {}


def _programs(slots: int, slot_rows: int, width: int):
  """``(small, big)`` jitted programs of equal work and stash traffic:
  ``slots`` slots written then read back, the stash 1 slot or ``slots``."""
  import jax  # pylint: disable=import-outside-toplevel
  import jax.numpy as jnp  # pylint: disable=import-outside-toplevel
  w = jnp.eye(width, dtype=jnp.float32) * 0.5

  def make(held: int):
    def run(x):
      def body(i, carry):
        g, stash = carry
        slot = i % held
        a = jnp.tanh((x + i.astype(x.dtype)) @ w)
        stash = jax.lax.dynamic_update_index_in_dim(stash, a, slot, 0)
        back = jax.lax.dynamic_index_in_dim(stash, slot, 0, False)
        return g + (1.0 - back * back) @ w, stash
      stash = jnp.zeros((held,) + x.shape, x.dtype)
      return jax.lax.fori_loop(0, slots, body, (jnp.zeros_like(x), stash))[0]
    return jax.jit(run)

  return make(1), make(slots)


def measure_seconds_per_byte(slots: int = 8, slot_bytes: int = 1 << 20,
                             rounds: int = 9, width: int = 256) -> float:
  """Process CPU seconds a step pays per byte of stash (the median over
  ``rounds`` paired rounds of the two programs of :func:`_programs`, their
  difference over ``(slots - 1) * slot_bytes``; never negative). Memoised
  per process."""
  key = (slots, slot_bytes, width)
  if key in _MEMO:
    return _MEMO[key]
  import jax  # pylint: disable=import-outside-toplevel
  import jax.numpy as jnp  # pylint: disable=import-outside-toplevel
  _compile_pool.drain()  # no background compile while timing
  rows = max(1, slot_bytes // (4 * width))
  x = jnp.ones((rows, width), jnp.float32) * 1e-3
  small, big = _programs(slots, rows, width)
  for run in (small, big):
    jax.block_until_ready(run(x))
  diffs = []
  for r in range(rounds):
    spent = {}
    for name, run in (((0, small), (1, big)) if r % 2 else
                      ((1, big), (0, small))):
      c0 = time.process_time()
      jax.block_until_ready(run(x))
      spent[name] = time.process_time() - c0
    diffs.append(spent[1] - spent[0])
  per_byte = max(0.0, statistics.median(diffs)) / ((slots - 1) * rows * width * 4)
  _MEMO[key] = per_byte
  return per_byte


def extra_seconds(stash_bytes: tuple[int, ...], base_bytes: tuple[int, ...],
                  seconds_per_byte: float, devices: int,
                  shared_cores: float | None) -> float:
  """Step seconds a schedule pays beyond ``base`` for its larger stash.

  Args:
    stash_bytes: Peak bytes per pipe device of the schedule.
    base_bytes: The same of the plan whose stand-in priced its ticks.
    seconds_per_byte: :func:`measure_seconds_per_byte`.
    devices: Devices of one pipeline (each runs the SPMD program, whose
      stash is shaped by the largest device's).
    shared_cores: Cores those devices share (CPU backend; None: each its
      own, so they pay it side by side).
  """
  if not stash_bytes or not base_bytes:
    return 0.0
  delta = max(stash_bytes) - max(base_bytes)
  spent = delta * seconds_per_byte
  if shared_cores:
    spent *= devices / shared_cores
  return spent
