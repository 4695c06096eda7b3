"""On-disk cache of priced frontiers, so a new process does not price again.

``placement="auto"`` prices every plan of a program (tens of builds); the
kernel and schedule caches make a second process's builds cheaper, but each
plan is still traced, cut and planned (README GPT, 4 devices: 9.9 s warm
with every kernel and schedule on disk). This cache keeps the whole
``ProgramFrontier`` instead, keyed by everything the prices depend on: the
program (its jaxpr on one micro-batch row, with a digest of its constants),
the full input shapes, the mesh (axis names, shape, device ids and kind),
the pricing options (placements, micro-batch counts, memory limit,
screening, ``tj.schedule`` options but the cache directory), the cost
source and ``XLA_FLAGS``, and the JAX version. It lives in the measurement
cache's directory as ``frontier-<sha256>.json``; the key also holds a
digest of tessel_jax's sources, so prices stored by other code are not
read back. A record that does not
read back is dropped and the frontier priced again.

Frontiers priced with uniform costs are not stored: they measure nothing,
so pricing them again is cheap, and their steps are in schedule steps.
"""

from __future__ import annotations

import functools
import hashlib
import os
from collections.abc import Mapping
from typing import Any

import jax
import numpy as np

from tessel_jax.cost import fused_grads as _fused_grads
from tessel_jax.cost.cache import ProfileCache, make_key
from tessel_jax.frontier_result import ProgramFrontier

KIND = "frontier"
FORMAT = 1  # bump when prices change meaning (cost model, pricing rules)
COST_ENV = "TESSEL_JAX_COST"  # as tessel_jax.scheduled.COST_ENV


def program_digest(traced: Any) -> str:
  """SHA-256 of a traced program (``passes.tracing.Traced``): its jaxpr
  text, its constants' bytes and its tree structures."""
  h = hashlib.sha256(str(traced.closed_jaxpr).encode("utf-8"))
  for const in traced.closed_jaxpr.consts:
    if jax.dtypes.issubdtype(getattr(const, "dtype", None),
                             jax.dtypes.prng_key):
      const = jax.random.key_data(const)  # a typed key has no numpy bytes
    arr = np.asarray(const)
    h.update(f"{arr.dtype}{arr.shape}".encode("utf-8"))
    h.update(np.ascontiguousarray(arr).tobytes())
  h.update(repr((traced.param_tree, traced.batch_tree,
                 traced.out_tree)).encode("utf-8"))
  return h.hexdigest()


@functools.lru_cache(maxsize=1)
def code_digest() -> str:
  """SHA-256 of tessel_jax's own sources (and of its ``passes``): a price
  stored by other code (another cost model, other pricing rules) is not
  read back."""
  try:  # installed: passes/ is tessel_jax.passes
    from tessel_jax import passes as _passes  # type: ignore  # pylint: disable=import-outside-toplevel
  except ImportError:  # run from the repository root
    import passes as _passes  # type: ignore  # pylint: disable=import-outside-toplevel
  h = hashlib.sha256()
  for root in (os.path.dirname(os.path.abspath(__file__)),
               os.path.dirname(os.path.abspath(_passes.__file__))):
    for folder, dirs, files in sorted(os.walk(root)):
      dirs.sort()
      for name in sorted(f for f in files if f.endswith(".py")):
        path = os.path.join(folder, name)
        h.update(os.path.relpath(path, root).encode("utf-8"))
        with open(path, "rb") as f:
          h.update(f.read())
  return h.hexdigest()


def mesh_fields(mesh: Any) -> dict[str, Any]:
  """What a mesh contributes to a price: axes, sizes, devices and kind."""
  devices = list(np.asarray(mesh.devices).flat)
  return {"axes": list(mesh.axis_names),
          "shape": [int(v) for v in dict(mesh.shape).values()],
          "ids": [int(d.id) for d in devices],
          "kind": sorted({f"{d.platform}:{getattr(d, 'device_kind', '')}"
                          for d in devices})}


def frontier_key(digest: str, params: Any, batch: Any, mesh: Any,
                 options: Mapping[str, Any]) -> str:
  """The cache key of one frontier.

  Args:
    digest: :func:`program_digest` of the program.
    params, batch: The inputs (only their shapes and dtypes count).
    mesh: The mesh priced on.
    options: The pricing options (made JSON-able with ``repr`` where
      needed); the cost source and ``XLA_FLAGS`` are added here.
  """
  leaves = jax.tree_util.tree_leaves((params, batch))
  return make_key({
      "kind": KIND, "frontier_format": FORMAT, "program": digest,
      "inputs": [[list(x.shape), str(x.dtype)] for x in leaves],
      "mesh": mesh_fields(mesh),
      "options": {k: repr(v) for k, v in sorted(options.items())},
      "cost_env": os.environ.get(COST_ENV, ""),
      # a flag given twice acts once: a child process that appended its
      # parent's flags again must find the parent's frontier
      "xla_flags": " ".join(dict.fromkeys(
          os.environ.get("XLA_FLAGS", "").split())),
      "jax": jax.__version__, "code": code_digest(),
      # kernels priced otherwise (only when on: old keys stay valid)
      **({"fused_grads": True} if _fused_grads.enabled() else {})})


class FrontierCache:
  """Priced frontiers on disk (see the module docstring).

  Args:
    directory: The cache directory (None: ``$TESSEL_JAX_CACHE`` or
      ``~/.cache/tessel_jax``).
  """

  def __init__(self, directory: str | None = None):
    self._store = ProfileCache(directory)

  def load(self, key: str) -> ProgramFrontier | None:
    """The stored frontier, or None (absent or unreadable: dropped)."""
    return self._store.decoded(
        KIND, key, lambda record: ProgramFrontier.from_dict(
            record["frontier"]), "frontier")

  def store(self, key: str, frontier: ProgramFrontier) -> None:
    """Writes the record (best effort, atomically); frontiers priced in
    schedule steps (uniform costs) or with no plan are not stored."""
    if not frontier.plans or any(p.unit != "ms" or not np.isfinite(p.step)
                                 for p in frontier.plans):
      return
    self._store.put(KIND, key, {"frontier": frontier.to_dict()})
