"""tessel_jax: searched pipeline schedules for JAX (Tessel + TensorOpt).

The pure-Python core (graph, schedule, search, validate, simulate) imports no
jax; the JAX half (``boundary``, ``schedule``, ``Placement``) is loaded on
first use, so ``import tessel_jax`` stays cheap for search-only users.
"""

from typing import Any

from tessel_jax import placements
from tessel_jax.checks import InputError
from tessel_jax.graph import Block, BlockGraph, Edge, PlacementError, make_graph
from tessel_jax.schedule import (Action, Repetend, Schedule, ScheduleError,
                                 UnrolledSchedule)

_JAX_API = ("Placement", "TesselError", "boundary", "schedule")


def schedule(fn: Any = None, /, **options: Any) -> Any:
  """Pipelines ``fn(params, batch)`` over a mesh axis; see ``tessel_jax.api``.

  ``tessel_jax.api.schedule`` documents every option. Defined here (rather
  than imported) so that ``import tessel_jax`` does not import jax, and so
  that ``tessel_jax.schedule`` is this function, not the ``schedule``
  submodule (import that with ``from tessel_jax.schedule import ...``).
  """
  from tessel_jax import api  # pylint: disable=import-outside-toplevel
  return api.schedule(fn, **options)


def frontier(fn: Any = None, /, **options: Any) -> Any:
  """Every plan of ``fn`` on a mesh, priced: ``tj.frontier(fn, mesh=...)
  (params, batch)`` gives a ``ProgramFrontier`` (``.plans``, ``.pareto``,
  ``.choose(memory_limit)``, ``.plot(path)``); see ``tessel_jax.plans``."""
  from tessel_jax import plans  # pylint: disable=import-outside-toplevel
  return plans.frontier(fn, **options)


def cpu_mesh(n: int = 4, axis: str = "pipe") -> Any:
  """A mesh of ``n`` fake CPU devices, for trying things out.

  See :func:`tessel_jax.fake_devices.cpu_mesh`; call it before other JAX work.
  """
  from tessel_jax import fake_devices  # pylint: disable=import-outside-toplevel
  return fake_devices.cpu_mesh(n, axis)


def boundary(*xs: Any) -> Any:
  """Ends a block of the program; identity otherwise (``tessel_jax.api``)."""
  from tessel_jax import api  # pylint: disable=import-outside-toplevel
  return api.boundary(*xs)


__all__ = [
    "Action", "Block", "BlockGraph", "Edge", "InputError", "PlacementError",
    "Repetend",
    "Schedule", "ScheduleError", "UnrolledSchedule", "make_graph",
    "cpu_mesh", "frontier", "placements", *_JAX_API,
]


def __getattr__(name: str) -> Any:
  if name in ("Placement", "TesselError"):
    from tessel_jax import api  # pylint: disable=import-outside-toplevel
    return getattr(api, name)
  raise AttributeError(f"module 'tessel_jax' has no attribute {name!r}")
