"""tessel_jax: searched pipeline schedules for JAX (Tessel + TensorOpt)."""

from tessel_jax.graph import Block, BlockGraph, Edge, PlacementError, make_graph
from tessel_jax.schedule import (Action, Repetend, Schedule, ScheduleError,
                                 UnrolledSchedule)

__all__ = [
    "Action", "Block", "BlockGraph", "Edge", "PlacementError", "Repetend",
    "Schedule", "ScheduleError", "UnrolledSchedule", "make_graph",
]
