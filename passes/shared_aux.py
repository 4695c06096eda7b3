"""Aux outputs of blocks that split a micro-batch's rows over devices.

A block on ``g`` devices that splits the rows runs each device on ``b / g``
rows. An aux value that keeps the batch axis comes back row by row, exactly.
An aux value without it (a metric, a batch statistic) is combined as the
mean of the devices' values, which equals ``fn``'s value only when it is a
mean over the rows of per-row values (an accuracy, a mean loss, a batch mean
feature). Anything else (a sum, a maximum, a variance, a count) would come
back silently different, so :func:`check` refuses it by name.

The check is numerical, like the affine check of the loss: the block is run
once on random inputs at the full micro-batch and once per device on its
rows, and the aux value must equal the mean of the devices' values.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from . import probe_eval as _probe_eval
from .errors import fail
from .kernels import KernelSet
from .partition import ForwardBlock, Partition


def check(part: Partition, ks: KernelSet,
          local_parts: Mapping[int, Partition]) -> None:
  """Refuses aux values a row-split block would compute differently.

  Args:
    part: The partition (``has_aux``).
    ks: Its kernels (``split``, ``in_split``, ``out_split`` per block).
    local_parts: Split factor ``g`` -> the partition traced on ``b / g``
      rows.

  Raises:
    TesselError: naming the aux leaf, the block and the fix.
  """
  epi = part.epilogue
  names = _aux_names(part)
  for j in part.aux_terminals:
    _, i, k = ks.terminals[j]
    kernel = ks.kernels[ks.forward_ids[i]]
    g = kernel.split
    if g <= 1 or not any(kernel.in_split) or kernel.out_split[k]:
      continue
    leaves = [names[o] for o in part.aux_outputs if j in epi.reads([o])]
    local = local_parts.get(g)
    problem = _problem(part.blocks[i], local.blocks[i] if local else None, k,
                       g, ks.microbatch_rows)
    if problem:
      raise fail(
          part.fn_name,
          f"the aux leaf {', '.join(leaves)} is computed in block {i}, which"
          f" runs on {g} devices {list(kernel.devices)} that each take"
          f" {ks.microbatch_rows // g} of the micro-batch's"
          f" {ks.microbatch_rows} rows; the value has no batch axis and"
          f" {problem}, so the devices' partial results would combine into a"
          f" different number than fn's. Return per-row values (batch axis"
          f" first) and reduce them after the step, make it a float mean over"
          f" the rows, or place block {i} on one device")


def _aux_names(part: Partition) -> dict[int, str]:
  """Flat output position -> the aux leaf's path (``aux['acc']``)."""
  tree = part.traced.aux_tree
  idx = jax.tree_util.tree_unflatten(tree, list(range(tree.num_leaves)))
  paths = jax.tree_util.tree_flatten_with_path(idx)[0]
  first = part.aux_outputs[0] if part.aux_outputs else 0
  return {first + leaf: "aux" + jax.tree_util.keystr(path)
          for path, leaf in paths}


def _problem(full: ForwardBlock, local: ForwardBlock | None, k: int, g: int,
             b: int) -> str | None:
  """Why output ``k`` is not the mean of its row-slice values (None: it is)."""
  aval = full.out_avals[k]
  if not jnp.issubdtype(aval.dtype, jnp.inexact):
    return (f"is of type {aval.dtype} (the mean of the devices' values is a"
            f" float)")
  if local is None:
    return "could not be checked (the block was not traced per device)"
  try:
    xs = _random_inputs(full.in_avals)
  except (TypeError, ValueError):
    return "could not be checked (no random inputs of its input types)"
  split = [bool(a.shape) and a.shape[0] == b and la.shape[0] == b // g
           and s.kind != "param"
           for a, la, s in zip(full.in_avals, local.in_avals, full.inputs)]
  want = np.asarray(_probe_eval.evaluate(lambda *v: full(*v)[k], xs))
  slices = [[x[d * b // g:(d + 1) * b // g] if s else x
             for x, s in zip(xs, split)] for d in range(g)]
  run_local = _probe_eval.compiled(lambda *v: local(*v)[k], slices[0])
  parts = [np.asarray(run_local(*xs_d)) for xs_d in slices]
  got = sum(p * (1.0 / g) for p in parts)
  tol = 1e-4 * (1.0 + float(np.nanmax(np.abs(want), initial=0.0)))
  if np.allclose(got, want, rtol=1e-4, atol=tol, equal_nan=True):
    return None
  return "is not the mean over the rows of per-row values (e.g. a sum, a" \
      " maximum, a variance or a count)"


def _random_inputs(avals: Sequence[Any]) -> list[Any]:
  """Random values of the given shapes: normal floats, 0/1 integers."""
  rng = np.random.default_rng(0)
  out = []
  for a in avals:
    dt = a.dtype
    if jax.dtypes.issubdtype(dt, jax.dtypes.prng_key):
      n = int(np.prod(a.shape, dtype=np.int64))
      keys = jax.random.split(jax.random.key(0), max(n, 1))[:n]
      out.append(keys.reshape(a.shape))
    elif jnp.issubdtype(dt, jnp.inexact):
      out.append(jnp.asarray(rng.standard_normal(a.shape), dt))
    else:
      out.append(jnp.asarray(rng.integers(0, 2, a.shape), dt))
  return out
