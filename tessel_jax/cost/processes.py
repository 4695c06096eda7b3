"""What a measurement depends on, and how processes agree on it.

Shared by ``cost.model`` and the modules it delegates to
(``cost.port_pricing``): the mesh a microbenchmark may use in a
multi-process run, process 0's figures on every process, and the machine
facts a per-machine record is keyed by.
"""

from __future__ import annotations

from typing import Any

from tessel_jax.cost import call_timing as _call_timing
from tessel_jax.cost import measure as _measure


def local_mesh(mesh: Any, pipe_axis: str) -> Any:
  """``mesh``, or in a multi-process run the devices this process holds as
  a one-axis mesh (microbenchmarks must not span processes)."""
  import jax  # pylint: disable=import-outside-toplevel
  import numpy as np  # pylint: disable=import-outside-toplevel
  if jax.process_count() == 1:
    return mesh
  mine = [d for d in mesh.devices.flat
          if d.process_index == jax.process_index()]
  return jax.sharding.Mesh(np.array(mine), (pipe_axis,))


def single_process() -> bool:
  """Whether this run has one process."""
  import jax  # pylint: disable=import-outside-toplevel
  return jax.process_count() == 1


def agree(values: Any) -> Any:
  """Process 0's values on every process (measurements differ between
  hosts, but every process must search the same schedule)."""
  import jax  # pylint: disable=import-outside-toplevel
  import numpy as np  # pylint: disable=import-outside-toplevel
  if jax.process_count() == 1:
    return values
  from jax.experimental import multihost_utils  # pylint: disable=import-outside-toplevel
  arr = np.asarray(values, np.float64)
  return multihost_utils.broadcast_one_to_all(arr).tolist()


def mesh_fields(mesh: Any, pipe_axis: str) -> dict[str, Any]:
  """What a per-tick or per-port measurement on ``mesh`` depends on: its
  cache key's machine facts (give :func:`local_mesh` of a multi-process
  mesh)."""
  device = mesh.devices.flat[0]
  return {"backend": device.platform, "device_kind": device.device_kind,
          "pipe": int(dict(mesh.shape)[pipe_axis]),
          "devices": len(mesh.devices.flat),
          "xla_flags": _measure.speed_flags(),
          "cpu_cores": (_call_timing.cpu_cores() if device.platform == "cpu"
                        else None)}
