"""The devices of one pipeline stage: where a kernel is profiled.

In the lowered program a block runs on one pipe index and one data replica,
over every device of the mesh's GSPMD axes (tensor parallelism): its
parameters split by their specs, XLA's collectives inside it. A
:class:`Stage` is that sub-mesh -- the user's mesh at pipe index 0 and data
index 0, every axis kept (the pipe and data axes with one device each), all
axes Auto -- and the GSPMD spec of every split parameter leaf, so
``measure`` can compile and time each kernel as it will run: inside a
``shard_map`` manual over the pipe and data axes, the parameters placed by
their specs, the tensor-parallel collectives included, and XLA's temp bytes
per device.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np


@dataclasses.dataclass(frozen=True, eq=False)
class Stage:
  """One stage's devices and the GSPMD specs of the split leaves.

  Attributes:
    mesh: The user's mesh at pipe index 0 and data index 0 (those axes of
      size 1), all axes Auto.
    manual: The pipe and data axes (manual in the program's map).
    specs: Leaf -> its spec entries over the GSPMD axes (leaves not here
      are replicated over them).
  """

  mesh: Any
  manual: tuple[str, ...]
  specs: Mapping[int, tuple[Any, ...]]

  @property
  def num_devices(self) -> int:
    """Devices of the stage (the product of the GSPMD axes)."""
    return int(self.mesh.devices.size)

  def key(self, leaves: Sequence[int]) -> dict[str, Any]:
    """What the stage contributes to a kernel's cache key (reading
    ``leaves``)."""
    return {"axes": {str(a): int(s) for a, s in self.mesh.shape.items()},
            "manual": list(self.manual),
            "specs": [repr(self.specs.get(l, ())) for l in leaves]}


def leaf_specs(layout: Any) -> dict[int, tuple[Any, ...]]:
  """Leaf -> GSPMD spec entries as the kernels read it (an FSDP leaf
  gathered over its data axes: ``SlotClass.inner_spec``)."""
  return {l: tuple(c.inner_spec) for c in layout.classes
          if any(e is not None for e in c.inner_spec)
          for row in c.assign for l in row if l >= 0}


def stage_of(mesh: Any, pipe_axis: str, data_axes: Sequence[str],
             layout: Any) -> Stage | None:
  """The stage sub-mesh of ``mesh``, or None when the GSPMD axes hold one
  device (every block runs on one device) or, in a multi-process run, the
  stage spans processes (kernels are then profiled on one device)."""
  import jax  # pylint: disable=import-outside-toplevel
  from jax.sharding import AxisType  # pylint: disable=import-outside-toplevel
  manual = (pipe_axis, *data_axes)
  names = tuple(mesh.axis_names)
  index = tuple(slice(0, 1) if a in manual else slice(None) for a in names)
  devices = np.asarray(mesh.devices)[index]
  if devices.size <= 1:
    return None
  if any(d.process_index != jax.process_index() for d in devices.flat):
    return None
  sub = jax.sharding.Mesh(devices, names,
                          axis_types=(AxisType.Auto,) * len(names))
  return Stage(mesh=sub, manual=manual, specs=leaf_specs(layout))
