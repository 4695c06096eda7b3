"""The function's outputs from the accumulated terminals (after the pipeline).

The lowered program returns, per terminal (block output the epilogue reads),
either its mean over all micro-batches (training, terminals only the loss
reads) or a buffer with one entry per micro-batch, ``(N, ...)`` in global
micro-batch order (data-parallel replicas in order; inference, and the
terminals aux outputs read in training). :class:`Outputs` applies the
epilogue:

* training: the loss is the epilogue's loss part at the terminals' means (it
  is affine, so that is the mean of the per-micro-batch losses); with
  ``has_aux`` the aux part is evaluated per micro-batch and every aux leaf
  is returned stacked, ``(N, ...)``, as ``((loss, aux), grads)`` needs;
* inference: the epilogue per micro-batch; outputs with a batch axis are
  concatenated along it (``(N * b, ...)``), scalars stacked (``(N,)``); with
  ``has_aux`` the aux leaves stay stacked per micro-batch (``(N, ...)``),
  exactly as in training.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp

from .partition import Epilogue, Partition


class Outputs:
  """Builds ``fn``'s outputs from the program's terminal results.

  Args:
    part: The partition (epilogue, output trees).
    per_mb: Terminal positions returned per micro-batch.
    terminal_avals: Full avals of the terminals (one micro-batch).
    total_microbatches: ``N`` over all data replicas.
  """

  def __init__(self, part: Partition, per_mb: frozenset[int],
               terminal_avals: Sequence[Any], total_microbatches: int):
    self.part = part
    self.per_mb = per_mb
    self.avals = tuple(terminal_avals)
    self.n = total_microbatches

  def train(self, vals: Sequence[Any]) -> Any:
    """``loss`` (or ``(loss, aux)`` with ``has_aux``) from terminal values:
    means for summed terminals, ``(N, ...)`` for per-micro-batch ones."""
    part, epi = self.part, self.part.epilogue
    if not part.traced.has_aux:
      return epi(*vals)[0]
    loss_reads = set(epi.reads(part.primary_outputs))
    means = []
    for j, (v, a) in enumerate(zip(vals, self.avals)):
      if j not in self.per_mb:
        means.append(v)
      elif j in loss_reads:
        means.append((v.sum(axis=0) / self.n).astype(v.dtype))
      else:  # only aux outputs read it; the loss part ignores it
        means.append(jnp.zeros(a.shape, a.dtype))
    loss = epi.select(part.primary_outputs)(*means)[0]
    aux = self._per_microbatch(epi.select(part.aux_outputs), vals, means)
    return loss, jax.tree_util.tree_unflatten(part.traced.aux_tree, aux)

  def infer(self, per_mb: Sequence[Any]) -> Any:
    """``fn``'s outputs for every micro-batch (module docstring)."""
    part, epi = self.part, self.part.epilogue
    outs = list(per_mb) if epi.is_identity else self._per_microbatch(
        epi, per_mb, per_mb)
    primary = [o.reshape((-1,) + tuple(o.shape[2:])) if o.ndim >= 2 else o
               for o in outs[:len(part.primary_outputs)]]
    traced = part.traced
    if not traced.has_aux:
      return jax.tree_util.tree_unflatten(traced.out_tree, primary)
    aux = outs[len(part.primary_outputs):]
    return (jax.tree_util.tree_unflatten(traced.primary_tree, primary),
            jax.tree_util.tree_unflatten(traced.aux_tree, aux))

  def _per_microbatch(self, epi: Epilogue, vals: Sequence[Any],
                      fallback: Sequence[Any]) -> list[Any]:
    """``epi`` per micro-batch: per-micro-batch terminals are mapped over
    their first axis, the others (``fallback``) passed whole; outputs are
    ``(N, ...)``."""
    args = [v if j in self.per_mb else fallback[j] for j, v in enumerate(vals)]
    axes = [0 if j in self.per_mb else None for j in range(len(vals))]
    if 0 not in axes:  # nothing varies per micro-batch
      return [jnp.broadcast_to(jnp.asarray(o), (self.n,) + jnp.shape(o))
              for o in epi(*args)]
    return list(jax.vmap(lambda *ts: epi(*ts), in_axes=tuple(axes))(*args))
