"""The opening shared by ``auto_plan_ticks`` and ``auto_plan_lowering``.

Sets the fake CPU device count before jax starts, then imports jax and
loads the program of ``experiments.auto_plan`` (the README GPT by default)
with its mesh and marker block count. No jax import at module level: a
runner calls :func:`start` from its ``main``, after absl parsed the flags.
"""

from __future__ import annotations

from typing import Any, NamedTuple


class Started(NamedTuple):
  """What :func:`start` loaded.

  Attributes:
    args: The ``auto_plan_lib.AutoPlanArgs`` the program was made from.
    fn: The loss function.
    params: Its parameters.
    batch: Its batch (``args.microbatches x args.microbatch_size`` rows).
    has_aux: Whether ``fn`` returns ``(loss, aux)``.
    mesh: A 1-D ``pipe`` mesh of ``args.devices`` fake CPU devices.
    markers: Blocks made by ``fn``'s ``tj.boundary`` markers.
  """

  args: Any
  fn: Any
  params: Any
  batch: Any
  has_aux: bool
  mesh: Any
  markers: int | None


def start(devices: int, **overrides: Any) -> Started:
  """Asks XLA for ``devices`` fake CPU devices, imports jax and loads
  ``auto_plan_lib.program(AutoPlanArgs(devices=devices, **overrides))``."""
  from experiments import xla_env  # pylint: disable=import-outside-toplevel
  xla_env.add_xla_flags(xla_env.cpu_flags(devices))
  import jax  # pylint: disable=import-outside-toplevel
  from experiments import auto_plan_lib as apl  # pylint: disable=import-outside-toplevel
  from tessel_jax import plans  # pylint: disable=import-outside-toplevel
  args = apl.AutoPlanArgs(devices=devices, **overrides)
  fn, params, batch, has_aux = apl.program(args)
  markers = plans.marker_blocks(fn, params, batch, {"has_aux": has_aux})
  return Started(args, fn, params, batch, has_aux,
                 jax.make_mesh((devices,), ("pipe",)), markers)
