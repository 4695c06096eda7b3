"""Lowering steps that A/B runs turn off (or on), given per schedule.

``tj.schedule(..., switches=Switches(hoist=False))`` lowers that step
without the step; every other step of the process keeps its own switches
(they travel with the step to ``passes.lower_context.LowerContext``, not in
module state). The defaults are the library's; ``TESSEL_JAX_TICK_ORDER=1``
turns tick compaction on for a step made without ``switches``
(:func:`from_env`, read when ``tj.schedule`` is applied, the one place the
variable is read).
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping

TICK_ORDER_ENV = "TESSEL_JAX_TICK_ORDER"
COARSE_GRID_ENV = "TESSEL_JAX_COARSE_GRID"
ALIGNED_GRID_ENV = "TESSEL_JAX_ALIGNED_GRID"
SHARED_W_ENV = "TESSEL_JAX_SHARED_W"
HELD_IN_KERNELS_ENV = "TESSEL_JAX_HELD_IN_KERNELS"
DISTINCT_FILLS_ENV = "TESSEL_JAX_DISTINCT_FILLS"
HOIST_ON_USERS_ENV = "TESSEL_JAX_HOIST_ON_USERS"
WRITES_IN_LOOPS_ENV = "TESSEL_JAX_WRITES_IN_LOOPS"
DISTINCT_KERNELS_ENV = "TESSEL_JAX_DISTINCT_KERNELS"


@dataclasses.dataclass(frozen=True)
class Switches:
  """Which optional lowering steps run.

  Attributes:
    hoist: Kernels' parameter-only work computed once before the ticks
      (``passes.hoist``); off: inside the ticks, as before it existed.
    straight_order: Stash writes in unrolled ticks ordered after the reads
      before them (``passes.tick_runs.straight``); off: unordered, as
      before 2026-11-26 (``experiments.mshape_profile
      --ab_straight_order``).
    tick_order: Ticks packed as early as each device's order allows
      (``passes.tick_order.compact``; off by default).
    residual_trim: Vjp residuals that ``B`` rebuilds with a few cheap
      equations are not stashed (``passes.residual_trim``); off: every
      residual stashed, as before 2026-11-26 (``experiments.mshape_profile
      --ab_residual_trim``).
    dead_taps: Convolution taps that only read padding sliced off their
      kernels before the cut (``passes.dead_taps``, exact; on by default
      since session 32: ResNet18 vshape(2) paired 0.78 wall, 0.68 CPU
      quietly, ``experiments.resnet_ab --variants=base,live_taps``); off:
      every tap kept, as before 2026-11-26. A program without dead taps is
      left as it is.
    workspace: Placed training calls (``step(placed, batch)``) write the
      hoisted values into a workspace the step keeps and donates to its
      next call (``passes.hoist.distinct``, ``tessel_jax.placed_step``), so
      XLA's CPU runtime does not malloc them afresh (above glibc's mmap
      threshold: fresh pages, faulted in every step); off: they live in
      the program's temp, as before 2026-11-26. The workspace stays
      allocated between steps. Ignored by the parameter-tree program and
      in inference.
    row_dots: A block's ``x @ W`` of at most 64 rows against a weight of
      at least 256 per side takes its input cotangent as ``(W @ dy.T).T``
      (``passes.row_dots``: the weight read in place, not repacked by
      YNNPACK; exact); on by default since session 33 (mshape(4) of the
      4-stage MLP: paired CPU 0.92-0.96, ``experiments.mshape_profile
      --ab_row_dots=10``); off: ``dy @ W.T``, as before 2026-11-26.
    row_dots_forward: With ``row_dots``, their forward too, as
      ``(W.T @ x.T).T`` with ``W.T`` hoisted (computed once per step);
      off by default.
    coarse_grid: With measured costs, the schedule searched on the
      measured spans on a coarser grid (``cost.quantize.coarser``) is a
      third candidate of the build's pick, lowered when predicted faster
      (``schedule_choice.choose``); on by default since session 34
      (peer_bench's 4-stage mshape: the loop-form schedule, 8-12% less CPU
      than the interpreted forms, in 4/6 cold builds against 1/6, see
      BENCHMARKS.md, helper "stage8"); off (``TESSEL_JAX_COARSE_GRID=0``):
      two candidates, as before 2026-11-27.
    grad_windows: A parameter gradient whose block reads the leaf only
      through static slices (``passes.dead_taps``' live taps) is added
      into its accumulator over the slices' box alone
      (``passes.grad_windows``, exact; ResNet18 vshape(2) paired 0.90
      CPU, 0.93 wall at load 14, ``experiments.resnet_ab
      --variants=base,no_grad_windows``); off: added whole, as before
      2026-11-27.
    aligned_grid: With ``coarse_grid``, that candidate is searched on the
      grid of one step per typical kernel (``cost.quantize.aligned``) where
      it exists, else on the coarser grid; on by default since session 35
      (peer_bench's 4-stage zbv: 51 ticks instead of 66, stash 26 instead of
      56 MB; quiet, 6 alternated pairs: zbv CPU x the hand GPipe 0.830-0.872,
      median 0.861, against 0.875-0.900, median 0.883, lower in 6/6 pairs;
      BENCHMARKS.md, helpers "zbv9" and the session-35 quiet section); off
      (``TESSEL_JAX_ALIGNED_GRID=0``): the coarser grid alone, as before.
    conv_forms: On a CPU mesh, every block's f32/f16 convolutions bound,
      forward and backward, in XLA:CPU's canonical order between explicit
      transposes
      (``passes.conv_forms``: XLA canonicalises only top-level convolutions,
      the ticks run kernels in branches and loop bodies, where the weight
      and input gradients ran as generic loops; exact); off: as JAX emits
      them, as before 2026-11-27.
    shared_w: A split backward (zbv, ZB-H1) hands ``W`` the values ``B``
      computes that both need (e.g. the cotangent at a weight's dot) and
      ``W`` reads only the residuals its own equations need
      (``passes.w_split``, exact); off by default (``TESSEL_JAX_SHARED_W=1``
      turns it on in ``from_env``): ``W`` runs the whole vjp again, pruned
      by XLA, as before 2026-11-27.
    held_in_kernels: In an interpreted segment, a held remote message is
      copied into its outbox by the kernel that made it, inside that
      kernel's 0/1-trip loop (``passes.local_writes``), on the devices
      that made one; an outbox only such kernels write has no sink slot
      and is sent as it is; a flush writes into the stash only on the
      devices receiving a message where at least half of its receipts are
      dummies (``passes.outbox``). On by default since session 37:
      peer_bench's 4-stage zbv, quiet, CPU x the hand GPipe 0.791/0.779
      on against 0.828/0.866 off (runs alternated, every round quiet;
      compact 0.803/0.758 against 0.868/0.862), one schedule in one
      process paired 0.887-0.946 loaded (``experiments.mshape_profile
      --ab_held_in_kernels``); the 2-stage compact program's HLO 148 -> 151
      kchars (BENCHMARKS.md, helper "zbv11" and "Quiet re-measure, session
      37"). Off (``TESSEL_JAX_HELD_IN_KERNELS=0``): every remote round
      copies every device's payload into its outbox at every boundary,
      into a sink slot where the device holds nothing, and every device
      writes every flush into the stash, as before 2026-11-27.
    cut_accumulation: The automatic cut also prices the parameter-gradient
      adds each block makes per micro-batch into its accumulators
      (``passes.autocut_accum``: the gradient's bytes, only the live box of
      a sliced parameter, at a measured in-place add rate, or at the
      roofline's bandwidth for analytic costs); off by default: quietly it
      moves no measured cut of the zoo, speeds ResNet18's analytic cut
      (0.88-0.92x wall) and slows hf_gpt2's and nnx_transformer's
      (1.04-1.06x) (BENCHMARKS.md "Quiet re-measure, session 38").
    distinct_fills: The step's zero-filled accumulators and stash pools
      each filled by a broadcast of its own (``passes.zero_fill``), not one
      fill per shape copied into the others by XLA (a copy reads and writes,
      a fill only writes). On by default since session 39: ResNet18
      vshape(2), nine runs (load 2.4-17), paired off/on CPU 0.998-1.072
      (above 1.01 in eight), wall 0.978-1.114 (``experiments.resnet_ab
      --variants=base,shared_fills``; BENCHMARKS.md, helper "resnet12").
      Off (``TESSEL_JAX_DISTINCT_FILLS=0``): ``jnp.zeros``, as before
      2026-11-27.
    hoist_on_users: With ``hoist``, a hoisted value whose reading kernels
      run on a subset of the devices is computed only there, under a
      ``lax.cond`` (zeros on the others; ``passes.hoist_users``). On by
      default since session 39: ResNet18 vshape(2) with both devices
      running at once (load 2.4-3.4), paired 0.930-0.933 wall, 0.947-0.967
      CPU over 41 rounds (device 0's prologue no longer slices device 1's
      weights, so device 1's first input arrives sooner); under load 6-17
      (threads time-sliced) CPU 0.983-1.017 (BENCHMARKS.md, helper
      "resnet12"). Off (``TESSEL_JAX_HOIST_ON_USERS=0``): every device
      computes every value, as before 2026-11-27.
    writes_in_loops: With ``held_in_kernels``, an interpreted segment's
      local messages and held remote ones are written by the kernel that
      made them inside its own 0/1-trip loop, right after it runs
      (``passes.local_writes.in_kernel``), not in a loop of their own at
      the next boundary: one while loop (body, condition, carried tuple)
      fewer per writing kernel (BENCHMARKS.md, helper "hlo16"). Off
      (``TESSEL_JAX_WRITES_IN_LOOPS=0``): a write loop per kernel at the
      next boundary, as before 2026-11-27.
    distinct_kernels: In an interpreted segment, kernels that are the
      same computation on the devices running them (identical blocks on
      different devices reading their parameters from the same slots,
      through the same ports, writing the same rounds:
      ``passes.kernel_groups``) share one 0/1-trip loop, so the program
      holds one body per distinct kernel. On by default since session 42:
      README GPT mshape(4), 7 bodies instead of 10, lowered HLO 5943 ->
      4657 instructions, paired in one process (load 5-10) compile CPU
      0.925 (median of 12), its single-core HLO passes 0.817, step CPU
      0.971 (40 paired calls) (BENCHMARKS.md, helper "main16"). Off
      (``TESSEL_JAX_DISTINCT_KERNELS=0``): a loop per kernel, as before
      2026-11-28.
  """

  hoist: bool = True
  straight_order: bool = True
  tick_order: bool = False
  residual_trim: bool = True
  dead_taps: bool = True
  workspace: bool = False
  row_dots: bool = True
  row_dots_forward: bool = False
  coarse_grid: bool = True
  grad_windows: bool = True
  aligned_grid: bool = True
  conv_forms: bool = True
  shared_w: bool = False
  held_in_kernels: bool = True
  cut_accumulation: bool = False
  distinct_fills: bool = True
  hoist_on_users: bool = True
  writes_in_loops: bool = True
  distinct_kernels: bool = True


def from_env(environ: Mapping[str, str] | None = None) -> Switches:
  """The default switches, ``tick_order`` on where
  ``TESSEL_JAX_TICK_ORDER=1`` and ``coarse_grid`` off where
  ``TESSEL_JAX_COARSE_GRID=0``, ``aligned_grid`` off where
  ``TESSEL_JAX_ALIGNED_GRID=0``, ``held_in_kernels`` off where
  ``TESSEL_JAX_HELD_IN_KERNELS=0``, ``distinct_fills`` off where
  ``TESSEL_JAX_DISTINCT_FILLS=0``, ``hoist_on_users`` off where
  ``TESSEL_JAX_HOIST_ON_USERS=0``, ``writes_in_loops`` off where
  ``TESSEL_JAX_WRITES_IN_LOOPS=0``, ``distinct_kernels`` off where
  ``TESSEL_JAX_DISTINCT_KERNELS=0`` (``environ``: default ``os.environ``; for
  A/B runs of benchmarks that build in worker processes)."""
  env = os.environ if environ is None else environ
  return Switches(tick_order=env.get(TICK_ORDER_ENV, "") == "1",
                  coarse_grid=env.get(COARSE_GRID_ENV, "") != "0",
                  aligned_grid=env.get(ALIGNED_GRID_ENV, "") != "0",
                  shared_w=env.get(SHARED_W_ENV, "") == "1",
                  held_in_kernels=env.get(HELD_IN_KERNELS_ENV, "") != "0",
                  distinct_fills=env.get(DISTINCT_FILLS_ENV, "") != "0",
                  hoist_on_users=env.get(HOIST_ON_USERS_ENV, "") != "0",
                  writes_in_loops=env.get(WRITES_IN_LOOPS_ENV, "") != "0",
                  distinct_kernels=env.get(DISTINCT_KERNELS_ENV, "") != "0")


__all__ = ["ALIGNED_GRID_ENV", "COARSE_GRID_ENV", "DISTINCT_FILLS_ENV",
           "DISTINCT_KERNELS_ENV",
           "HELD_IN_KERNELS_ENV", "HOIST_ON_USERS_ENV", "SHARED_W_ENV",
           "Switches", "TICK_ORDER_ENV", "WRITES_IN_LOOPS_ENV", "from_env"]
