"""The vjp side of a block's kernels: residuals, output cotangents, gradients.

:class:`Vjp` derives a forward block's backward with ``jax.vjp`` (keeping the
vjp residuals or recomputing them) and :class:`Ybar` sums the cotangents of a
block's outputs (consumers' plus terminal seeds). A block on several devices
counts each contribution once: a split block's batch-independent outputs
take their cotangent on the leader only, a replicated block's parameter
gradients count on the leader only (``ctx["row_offset"] == 0``).
"""

from __future__ import annotations

import collections
import dataclasses
import hashlib
from collections.abc import Mapping, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from tessel_jax import compat

from . import residual_trim

def sds(shape: Sequence[int], dtype: Any) -> jax.ShapeDtypeStruct:
  return jax.ShapeDtypeStruct(tuple(shape), dtype)


def inexact(aval: Any) -> bool:
  return jnp.issubdtype(aval.dtype, jnp.inexact)


def zero_cot(aval: Any) -> Any:
  if inexact(aval):
    return jnp.zeros(aval.shape, aval.dtype)
  return compat.float0_zeros(tuple(aval.shape))


def leader_only(ctx: Mapping[str, Any], x: Any) -> Any:
  """``x`` on the block's leader (``row_offset == 0``), zeros elsewhere."""
  rank = ctx["row_offset"]
  if isinstance(rank, (int, np.integer)):
    return x if rank == 0 else jnp.zeros_like(x)
  return jnp.where(rank == 0, x, jnp.zeros_like(x))


@dataclasses.dataclass
class _Residuals:
  """Static facts of a block's vjp closure (from one abstract trace)."""

  treedef: Any = None
  alias: tuple[int | None, ...] = ()   # leaf -> diff position (param) or None
  avals: tuple[jax.ShapeDtypeStruct, ...] = ()
  # Which residuals are stashed; B rebuilds the rest (passes.residual_trim).
  recipe: Any = None
  # The vjp closure's structure as traced under each context mesh: it holds
  # the block's linearised program, whose sharding constraints name the
  # mesh they were traced under (the lowering's shard_map differs from the
  # abstract probe's).
  treedefs: dict[Any, Any] = dataclasses.field(default_factory=dict)


class Ybar:
  """Summed output cotangents of a block: consumers' plus terminal seeds.

  Split blocks take their rows of a seed; a partial sum over the rows takes
  the seed times its ratio ``r`` on every device; any other output without
  the batch axis (batch-independent) counts on the leader only. A
  replicated block takes whole seeds on every device (each computes the
  full input cotangents; its parameter gradients count on the leader).
  """

  def __init__(self, blk: Any, cot_slot: Sequence[int],
               seed_of: Mapping[int, Any]):
    self.blk = blk
    self.cot_slot = tuple(cot_slot)
    self.seed_of = dict(seed_of)

  def __call__(self, ctx: Mapping[str, Any], cots: Sequence[Any]) -> list[Any]:
    blk = self.blk
    bars: list[Any] = [None] * len(blk.local_out)
    for k, c in zip(self.cot_slot, cots):
      bars[k] = c if bars[k] is None else bars[k] + c
    for k, seed in self.seed_of.items():
      aval = blk.local_out[k]
      s = jnp.asarray(seed, aval.dtype)
      if blk.out_split[k]:
        s = jax.lax.dynamic_slice_in_dim(s, ctx["row_offset"], aval.shape[0])
      bars[k] = s if bars[k] is None else bars[k] + s
    summed = dict(blk.mode.summed)
    out = []
    for k, (a, x) in enumerate(zip(blk.local_out, bars)):
      if x is None:
        out.append(zero_cot(a))
      elif k in summed:
        out.append(x * jnp.asarray(summed[k], x.dtype))
      elif blk.split > 1 and not blk.out_split[k]:
        out.append(leader_only(ctx, x))
      else:
        out.append(x)
    return out


#: Abstract vjp probes (:meth:`Vjp.residual_avals`) by block content:
#: ``placement="auto"`` cuts the same program once per placement, width and
#: N, and the blocks of equal cuts are equal (README GPT, 5 placements: 48
#: probes, ~4% of a cold choice). Least recently used dropped first.
_PROBES: "collections.OrderedDict[tuple, tuple]" = collections.OrderedDict()
PROBES_SIZE = 512


def _content_key(blk: Any, diff_pos: Sequence[int], trim: bool
                 ) -> tuple | None:
  """A block's vjp by content: its equations (printed, names by position),
  constants, input kinds and avals, parameter order, the differentiated
  positions (with the context mesh: the key of :data:`_PROBES`); None (not
  shared) for a block without a jaxpr slice or with constants that are not
  concrete."""
  fb = blk.fb
  if not all(hasattr(fb, a) for a in ("eqns", "invars", "const_vars",
                                      "const_vals", "outvars")):
    return None
  text = compat.jaxpr_text(fb.eqns, tuple(fb.invars) + tuple(fb.const_vars),
                           fb.outvars)
  h = hashlib.sha256()
  try:
    for v in fb.const_vals:
      a = np.asarray(v)
      h.update(f"{a.dtype}{a.shape}".encode())
      h.update(a.tobytes())
  except Exception:  # pylint: disable=broad-except
    return None  # e.g. a tracer or typed PRNG keys
  # Object addresses in the text (functions of custom rules) stay: blocks
  # calling different functions never share a probe.
  return (text, h.hexdigest(),
          tuple((r.kind, r.leaf if r.kind == "param" else None)
                for r in blk.ins),
          tuple((tuple(a.shape), str(a.dtype)) for a in blk.local_in),
          tuple(blk.params), tuple(diff_pos), trim)


#: Forward kernels' programs (a block's outputs and the vjp residuals it
#: keeps, as one closed jaxpr) by block content, vjp residual structure,
#: trace context and input avals: every kernel set containing the block
#: (README GPT cold choice: 84 forward traces of 27 distinct blocks) and
#: every trace of one kernel (hoisted bytes, flops, profile, tick form)
#: evaluates one linearisation instead of linearising the block again.
#: Least recently used dropped first.
_FORWARDS: "collections.OrderedDict[tuple, tuple]" = collections.OrderedDict()
FORWARDS_SIZE = 512
#: Forward linearisations traced into ``_FORWARDS`` (misses), put there by
#: the residual probe (:meth:`Vjp.residual_avals`: the same program) and
#: served from it (hits), for tests and benchmarks.
FORWARD_STATS: collections.Counter = collections.Counter()


class Vjp:
  """The vjp of one block: forward with residuals, backward from them.

  * keep: ``F`` returns its outputs plus the vjp residuals (leaves of the
    vjp closure that are not the block's own parameters); ``B`` rebuilds
    the closure from them and the parameter buffer;
  * recompute: ``F`` stashes its non-parameter inputs and ``B`` runs
    ``jax.vjp`` again.
  """

  def __init__(self, blk: Any, diff_pos: Sequence[int], keep: bool,
               trim: bool = True):
    self.blk = blk
    self.diff_pos = tuple(diff_pos)
    self.keep = keep
    self.trim = trim  # residuals B rebuilds left out (passes.residual_trim)
    self.res = _Residuals()
    self.grad_leaves = tuple(blk.ins[p].leaf for p in diff_pos
                             if blk.ins[p].kind == "param")

  def vjp_of(self, pvals: Sequence[Any], dvals: Sequence[Any]) -> Any:
    vals = self.blk.assemble(pvals, dvals)

    def f(*diff):
      v = list(vals)
      for p, x in zip(self.diff_pos, diff):
        v[p] = x
      return self.blk.fb(*v)
    return jax.vjp(f, *[vals[p] for p in self.diff_pos]), vals

  def _probe(self, pvals: Sequence[Any], dvals: Sequence[Any]) -> list[Any]:
    """The block's outputs, then the vjp residuals (closure leaves that are
    not its parameters); notes the closure's structure and aliases."""
    (ys, vjp), vals = self.vjp_of(pvals, dvals)
    leaves, treedef = jax.tree_util.tree_flatten(vjp)
    alias = []
    for leaf in leaves:
      hit = None
      for q, p in enumerate(self.diff_pos):
        if self.blk.ins[p].kind == "param" and leaf is vals[p]:
          hit = q
          break
      alias.append(hit)
    self.res.treedef = treedef
    self.res.alias = tuple(alias)
    self._probe_ys = len(ys)
    return list(ys) + [leaf for leaf, a in zip(leaves, alias) if a is None]

  def residual_avals(self) -> tuple[Any, ...]:
    """Avals of what ``F`` stashes for ``B`` (one abstract trace, shared by
    blocks of equal content: :data:`_PROBES`)."""
    blk = self.blk
    if not self.keep:
      return blk.data_avals
    content = self._content_of()
    key = None if content is None else content + (compat.context_mesh(),)
    hit = _PROBES.get(key) if key is not None else None
    if hit is not None:
      _PROBES.move_to_end(key)
      (self.res.treedef, self.res.alias, self.res.avals,
       self.res.recipe) = hit
      return self.res.avals
    pv = self._param_avals()
    both, _ = compat.make_jaxpr(self._probe, pv, list(blk.data_avals))
    num_ys = self._probe_ys
    closed = compat.with_outvars(both, compat.jaxpr_io(both)[1][num_ys:])
    recipe = residual_trim.find(closed, len(pv), self.trim)
    kept = recipe.keep(closed.out_avals)
    # The probe is the forward on these avals: kernels traced on them
    # (hoisted bytes, flops, profile) evaluate it (``_FORWARDS``).
    fkey = self._forward_key(pv + list(blk.data_avals))
    if fkey is not None and fkey not in _FORWARDS:
      _FORWARDS[fkey] = (both, num_ys, self.res.treedef)
      FORWARD_STATS["probed"] += 1
      while len(_FORWARDS) > FORWARDS_SIZE:
        _FORWARDS.popitem(last=False)
    self.res.recipe = recipe
    self.res.avals = tuple(sds(a.shape, a.dtype) for a in kept)
    if key is not None:
      _PROBES[key] = (self.res.treedef, self.res.alias, self.res.avals,
                      recipe)
      while len(_PROBES) > PROBES_SIZE:
        _PROBES.popitem(last=False)
    return self.res.avals

  def forward(self, ctx: Any, pvals: Sequence[Any], dvals: Sequence[Any]
              ) -> tuple[list[Any], list[Any]]:
    del ctx
    if not self.keep:
      return list(self.blk.fb(*self.blk.assemble(pvals, dvals))) + list(
          dvals), []
    args = list(pvals) + list(dvals)
    key = self._forward_key(args)
    if key is None:
      ys, res = self._linearised(pvals, dvals)
      return ys + self.res.recipe.keep(res), []
    hit = _FORWARDS.get(key)
    if hit is None:
      hit = _FORWARDS[key] = self._trace_forward(args, len(pvals))
      FORWARD_STATS["traced"] += 1
      while len(_FORWARDS) > FORWARDS_SIZE:
        _FORWARDS.popitem(last=False)
    else:
      _FORWARDS.move_to_end(key)
      FORWARD_STATS["shared"] += 1
    closed, num_ys, treedef = hit
    self.res.treedefs[compat.context_mesh()] = treedef
    outs = compat.eval_closed(closed, args)
    return outs[:num_ys] + self.res.recipe.keep(outs[num_ys:]), []

  def _linearised(self, pvals: Sequence[Any], dvals: Sequence[Any]
                  ) -> tuple[list[Any], list[Any]]:
    """``(outputs, vjp residuals)``: the block linearised on these values
    (the closure's structure noted for the current context mesh)."""
    (ys, vjp), _ = self.vjp_of(pvals, dvals)
    leaves, treedef = jax.tree_util.tree_flatten(vjp)
    if len(leaves) != len(self.res.alias):
      raise AssertionError("vjp residual structure changed between traces")
    self.res.treedefs[compat.context_mesh()] = treedef
    return list(ys), [leaf for leaf, a in zip(leaves, self.res.alias)
                      if a is None]

  def _forward_key(self, args: Sequence[Any]) -> tuple | None:
    """The :data:`_FORWARDS` key of the forward on ``args`` (None: not
    shared: a block without a content key, or an input whose type a
    ``ShapeDtypeStruct`` does not carry, ``compat.plain_aval``)."""
    content = self._content_of()
    if content is None:
      return None
    avals = [compat.plain_aval(x) for x in args]
    if any(a is None for a in avals):
      return None
    return (content, self.res.alias, compat.context_mesh(),
            tuple((a.shape, str(a.dtype), a.weak_type) for a in avals))

  def _content_of(self) -> tuple | None:
    """:func:`_content_key` of this vjp's block (printed once)."""
    if not hasattr(self, "_content"):
      self._content = _content_key(self.blk, self.diff_pos, self.trim)
    return self._content

  def _trace_forward(self, args: Sequence[Any], num_p: int
                     ) -> tuple[Any, int, Any]:
    """``(closed jaxpr, outputs, vjp closure structure)``: the forward on
    ``args``' avals as one program, ``args -> outputs + residuals``."""
    box: dict[str, Any] = {}

    def f(pv, dv):
      ys, res = self._linearised(pv, dv)
      box["num_ys"] = len(ys)
      box["treedef"] = self.res.treedefs[compat.context_mesh()]
      return ys + res
    avals = [compat.plain_aval(x) for x in args]
    closed, _ = compat.make_jaxpr(f, avals[:num_p], avals[num_p:])
    return closed, box["num_ys"], box["treedef"]

  def backward(self, ctx: Any, pvals: Sequence[Any], rvals: Sequence[Any],
               ybar: Sequence[Any], *, acts: bool = True, grads: bool = True
               ) -> tuple[list[Any], list[Any]]:
    """Input cotangents (activations) and parameter gradients.

    A replicated block's parameter gradients count on its leader only.
    """
    act, grad = self._apply(pvals, rvals, ybar)
    if self.blk.mode.mode == "replicated":
      grad = [leader_only(ctx, x) for x in grad]
    return (act if acts else []), (grad if grads else [])

  def _param_avals(self) -> list[Any]:
    """Avals of the block's parameters, in ``blk.params`` order."""
    blk = self.blk
    return [blk.local_in[[q for q, r in enumerate(blk.ins)
                          if r.kind == "param" and r.leaf == l][0]]
            for l in blk.params]

  def backward_jaxpr(self) -> Any:
    """The backward traced once: ``(params, stashed residuals, inexact
    output cotangents) -> input cotangents + parameter gradients`` (no
    leader-only masking; nested calls inlined), for
    ``passes.w_split.find``. Call after :meth:`residual_avals`."""
    blk = self.blk
    pv = self._param_avals()
    rv = list(self.residual_avals())
    slots = [k for k, a in enumerate(blk.local_out) if inexact(a)]

    def f(pvals, rvals, ibars):
      bars = [zero_cot(a) for a in blk.local_out]
      for k, v in zip(slots, ibars):
        bars[k] = v
      act, grad = self._apply(pvals, rvals, bars)
      return list(act) + list(grad)
    closed, _ = compat.make_jaxpr(
        f, pv, rv, [sds(blk.local_out[k].shape, blk.local_out[k].dtype)
                    for k in slots])
    return compat.flatten_jaxpr(closed)

  def _apply(self, pvals: Sequence[Any], rvals: Sequence[Any],
             ybar: Sequence[Any]) -> tuple[list[Any], list[Any]]:
    """The vjp applied to ``ybar``: ``(input cotangents, gradients)``."""
    if self.keep:
      by_leaf = dict(zip(self.blk.params, pvals))
      it = iter(self.res.recipe.rebuild(rvals, pvals))
      leaves = [next(it) if a is None else
                by_leaf[self.blk.ins[self.diff_pos[a]].leaf]
                for a in self.res.alias]
      treedef = self.res.treedefs.get(compat.context_mesh(), self.res.treedef)
      vjp = jax.tree_util.tree_unflatten(treedef, leaves)
    else:
      (_, vjp), _ = self.vjp_of(pvals, rvals)
    bars = vjp(as_cot(ybar))
    ins = self.blk.ins
    act = [x for p, x in zip(self.diff_pos, bars) if ins[p].kind == "value"]
    grad = [x for p, x in zip(self.diff_pos, bars) if ins[p].kind == "param"]
    return act, grad


def as_cot(ybar: Sequence[Any]) -> Any:
  """Cotangent structure of a block's output list (``fb`` returns a list)."""
  return list(ybar)
