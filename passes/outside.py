"""The part of a lowered training step outside its ticks, alone.

The lowered training step (``passes.lower_program``'s ``run``) packs the
parameters into per-device buffers before its ``shard_map``
(``pack_local.pack``, each slot placed by its spec) and, after it, unpacks
the packed gradients (gathered over the pipe axis,
``pack_arrays.unpack_grads``) and places every gradient as its parameter is
placed. :func:`outside_program` is that program with the
map left out (the packed parameters stand for the packed gradients,
which have their shapes), so ``cost`` can time what a step pays once,
serially with its ticks: on the README GPT (tp_bench, 4 CPU devices, 2
cores, real-time priority) 2.8-7.3 ms of a 17-30 ms step, which the
replay of the ticks did not count.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp

from . import fsdp as _fsdp
from . import pack_local as _pack_local
from .pack_arrays import unpack_grads
from .packing import Layout


def outside_program(layout: Layout, mesh: Any, pipe: str,
                    data: Sequence[str], param_avals: Sequence[Any]
                    ) -> Callable[[Any], Any]:
  """``fn(params) -> grads``: the step of ``layout`` on ``mesh`` (all axes
  Auto, as the lowering's) without its map: pack, place, unpack as if the
  packed parameters were the gradients, place."""
  specs = _fsdp.leaf_specs(layout)

  def run(params: Any) -> Any:
    leaves = jax.tree_util.tree_leaves(params)
    packed, slots = _pack_local.pack(layout, leaves, mesh, pipe, data)
    slots = [[_fsdp.place(mesh, a, (pipe,) + c.spec) for a in arrays]
             for arrays, c in zip(slots, layout.classes)]
    grads = unpack_grads(layout, packed,
                         [jnp.stack(a, axis=1) for a in slots], param_avals,
                         mesh=mesh)
    return [g if l in layout.shards else
            _fsdp.place(mesh, g, specs.get(l, ()), replicate=True)
            for l, g in enumerate(grads)]

  return run
