"""Sharded leaves read by blocks on a strict subset of the pipe axis.

A leaf sharded over the pipe axis (``param_sharding``) is stored as one
slice per device. A block on *every* device gathers it at its tick with one
``all_gather`` (``passes.lower``). A block on a strict subset of the devices
(mshape's head on one device reading a sharded tied embedding) cannot: a
collective inside a branch that only some devices take hangs. Instead, the
program gathers the full leaf onto those devices (the *owners*) once, before
the first tick, and scatters its gradient back to the shards once, after the
last, both outside every branch:

* gather: ``D - 1`` static ``ppermute``s; at shift ``s`` every owner ``o``
  receives the shard of device ``o - s`` (a partial permutation: only owners
  receive), then concatenates the shards in device order;
* scatter: the owners accumulate the full-shaped gradient where those blocks
  run; at shift ``s`` every owner ``o`` sends the slice of device ``o + s``
  to it, and every device adds what it receives to its own slice.

Every device of the SPMD program holds a full-leaf buffer (zeros except on
the owners), so ``packing.Layout.bytes_per_device`` counts it everywhere.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import jax.numpy as jnp
from jax import lax


def gather(shard: Any, axis: int, owners: Sequence[int], num_devices: int,
           pipe: str, dev: Any) -> Any:
  """The full leaf on ``owners`` from every device's ``shard``.

  Args:
    shard: This device's slice (slice ``dev`` along ``axis``).
    axis: The sharded dimension.
    owners: Devices that need the full leaf.
    num_devices: Devices on the pipe axis.
    pipe: Pipe axis name.
    dev: This device's index (``lax.axis_index``).

  Returns:
    The full leaf on the owners (other devices: a same-shaped buffer holding
    their shard and zeros).
  """
  d = num_devices
  received = [shard]
  for s in range(1, d):
    perm = [((o - s) % d, o) for o in owners]
    received.append(lax.ppermute(shard, pipe, perm=perm))
  stacked = jnp.stack(received)  # [s]: the shard of device dev - s
  by_device = jnp.take(stacked, (dev - jnp.arange(d)) % d, axis=0)
  return jnp.concatenate([by_device[j] for j in range(d)], axis=axis)


def scatter(full: Any, axis: int, owners: Sequence[int], num_devices: int,
            pipe: str, dev: Any) -> Any:
  """This device's slice of the sum over owners of their ``full`` gradients.

  Args:
    full: This device's full-shaped gradient (zeros off the owners).
    axis: The sharded dimension.
    owners: Devices whose ``full`` counts.
    num_devices: Devices on the pipe axis.
    pipe: Pipe axis name.
    dev: This device's index.

  Returns:
    The gradient of slice ``dev`` (the shard's shape).
  """
  d = num_devices
  n = full.shape[axis] // d

  def piece(j: Any) -> Any:
    return lax.dynamic_slice_in_dim(full, j * n, n, axis=axis)

  total = piece(dev)
  for s in range(1, d):
    perm = [(o, (o + s) % d) for o in owners]
    total = total + lax.ppermute(piece((dev + s) % d), pipe, perm=perm)
  return total
