"""Backward derivation: one kernel per placement block (F, B, W).

A kernel is what one device runs when the schedule starts a block on it:
``fn(ctx, params, inputs) -> (outputs, grads)`` on *local* values (a block on
``g`` devices shares its work along the micro-batch's batch axis, each device
taking ``b / g`` rows).

Training derives the backward per forward block with ``jax.vjp``:

* keep (default): ``F`` returns its outputs plus the vjp residuals (leaves of
  the vjp closure; residuals that are the block's own parameters are not
  stashed, ``B`` reads them from the parameter buffer again); ``B`` rebuilds
  the closure and applies it to the summed output cotangents;
* recompute: ``F`` stashes its non-parameter inputs and ``B`` runs
  ``jax.vjp`` again (rematerialisation).

With a split backward, ``B`` computes the input cotangents and passes the
summed output cotangents to ``W``, which computes the parameter gradients
(XLA prunes the half of the vjp each kernel does not return).

Values are named by keys: ``("y", i, k)`` output ``k`` of forward block ``i``;
``("r", i, r)`` residual ``r`` of block ``i``; ``("c", j, p)`` cotangent of
input ``p`` of forward block ``j``; ``("g", i, k)`` summed cotangent of output
``k`` of block ``i`` (B -> W).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from tessel_jax import compat

from .errors import fail
from .partition import ForwardBlock, Partition

Key = tuple


@dataclasses.dataclass(frozen=True)
class InRef:
  """One kernel input: a stored value (``key``) or a micro-batch leaf."""

  kind: str  # "value" | "batch"
  key: Key = ()
  leaf: int = -1


@dataclasses.dataclass(frozen=True, eq=False)
class Kernel:
  """What a device runs for one placement block.

  Attributes:
    block_id: Graph block id.
    label: ``F3``, ``B3`` or ``W3``.
    kind: ``F``, ``B`` or ``W``.
    fwd: Forward block index.
    devices: Devices of the block.
    split: Batch split factor (``len(devices)`` for a shared block, else 1).
    params: Parameter leaf indices it reads (its forward block's region).
    inputs: Inputs in call order.
    in_avals: Local input avals.
    in_split: Per input: the local value is this device's rows of the
      micro-batch value.
    outputs: Keys of its outputs.
    out_avals: Local output avals.
    out_split: Per output: rows of a split value.
    grads: Parameter leaves whose gradients it returns (aligned with the
      second result of ``fn``).
    fn: ``fn(ctx, params, inputs) -> (outputs, grads)``; ``ctx`` has
      ``row_offset`` (first batch row of this device, traced int).
  """

  block_id: int
  label: str
  kind: str
  fwd: int
  devices: tuple[int, ...]
  split: int
  params: tuple[int, ...]
  inputs: tuple[InRef, ...]
  in_avals: tuple[jax.ShapeDtypeStruct, ...]
  in_split: tuple[bool, ...]
  outputs: tuple[Key, ...]
  out_avals: tuple[jax.ShapeDtypeStruct, ...]
  out_split: tuple[bool, ...]
  grads: tuple[int, ...]
  fn: Callable[..., tuple[list[Any], list[Any]]]

  @property
  def stash_bytes(self) -> int:
    """Bytes of residual outputs (``("r", ...)`` keys) per device."""
    return sum(_nbytes(a) for k, a in zip(self.outputs, self.out_avals)
               if k[0] == "r")


@dataclasses.dataclass(frozen=True, eq=False)
class KernelSet:
  """All kernels of a lowering, plus the facts the planner needs.

  Attributes:
    kernels: By graph block id.
    forward_ids: Graph id of ``F{i}`` by forward index.
    terminals: ``("y", i, k)`` keys the epilogue reads, in order.
    terminal_avals: Full (logical) avals of the terminals.
    microbatch_rows: Rows ``b`` of one micro-batch.
    value_avals: Full (logical) aval of every value key.
    value_split: Whether a key's value is split along rows over its
      producer's devices.
    keep: Per forward index: residuals kept (True) or recomputed (False).
    train: Training (True) or inference kernels.
  """

  kernels: Mapping[int, Kernel]
  forward_ids: Mapping[int, int]
  terminals: tuple[Key, ...]
  terminal_avals: tuple[jax.ShapeDtypeStruct, ...]
  microbatch_rows: int
  value_avals: Mapping[Key, jax.ShapeDtypeStruct]
  value_split: Mapping[Key, bool]
  keep: Mapping[int, bool]
  train: bool

  def producer(self, key: Key) -> Kernel:
    for k in self.kernels.values():
      if key in k.outputs:
        return k
    raise KeyError(key)


def _local_block(name: str, full: ForwardBlock, local: Partition | None,
                 g: int) -> ForwardBlock:
  """Block ``full.index`` of the partition traced at ``b / g`` rows."""
  if local is None or len(local.blocks) <= full.index:
    raise fail(name, f"block {full.index} is shared by {g} devices but the"
               f" function was not traced at the per-device batch size")
  fb = local.blocks[full.index]
  if fb.inputs != full.inputs or len(fb.outvars) != len(full.outvars):
    raise fail(
        name,
        f"block {full.index} runs on {g} devices, so it is traced again on"
        f" 1/{g} of the micro-batch rows, and that trace reads or exports"
        f" different values than the full one; shared blocks need a function"
        f" whose structure does not depend on the batch size")
  return fb


def _nbytes(aval: Any) -> int:
  return int(np.prod(aval.shape, dtype=np.int64)) * np.dtype(aval.dtype).itemsize


def _sds(shape: Sequence[int], dtype: Any) -> jax.ShapeDtypeStruct:
  return jax.ShapeDtypeStruct(tuple(shape), dtype)


def _inexact(aval: Any) -> bool:
  return jnp.issubdtype(aval.dtype, jnp.inexact)


def _zero_cot(aval: Any) -> Any:
  if _inexact(aval):
    return jnp.zeros(aval.shape, aval.dtype)
  return compat.float0_zeros(tuple(aval.shape))


def _batch_dependent(fb: ForwardBlock, split_inputs: Sequence[bool]) -> list[bool]:
  """Per output: depends on an input that is split along the batch."""
  tainted = {v for v, s in zip(fb.invars, split_inputs) if s}
  for eqn in fb.eqns:
    if any(not compat.is_literal(v) and v in tainted for v in eqn.invars):
      tainted.update(eqn.outvars)
  return [not compat.is_literal(v) and v in tainted for v in fb.outvars]


@dataclasses.dataclass
class _Residuals:
  """Static facts of a block's vjp closure (from one abstract trace)."""

  treedef: Any = None
  alias: tuple[int | None, ...] = ()   # leaf -> diff position (param) or None
  avals: tuple[jax.ShapeDtypeStruct, ...] = ()


def build_kernels(part: Partition, graph: Any, *, train: bool,
                  microbatch_rows: int, keep: Mapping[int, bool] | None = None,
                  seeds: Sequence[Any] | None = None,
                  forward_of: Mapping[int, int] | None = None,
                  local_parts: Mapping[int, Partition] | None = None
                  ) -> KernelSet:
  """Builds every kernel for ``graph``.

  Args:
    part: The partition (forward blocks and epilogue).
    graph: The placement BlockGraph (ids, kinds, devices).
    train: Training (F, B, W kernels) or inference (F only; B/W ignored).
    microbatch_rows: ``b``.
    keep: Per forward index: keep residuals (default True for all).
    seeds: Per terminal: the constant cotangent of the loss with respect to
      the terminal's per-micro-batch mean (full aval); train only.
    forward_of: Graph block id -> forward index (default: parse names).
    local_parts: Split factor ``g`` -> the partition of the function traced
      on ``b / g`` rows (jaxprs are shape-specialised, so a block shared by
      ``g`` devices runs the equations traced at its local size).

  Raises:
    TesselError: for a shared block whose work cannot be split by rows.
  """
  name = part.fn_name
  b = microbatch_rows
  keep = dict(keep or {})
  if forward_of is None:
    from tessel_jax import placements  # pylint: disable=import-outside-toplevel
    forward_of = {blk.id: placements.forward_index(blk) for blk in graph.blocks}
  by_kind: dict[tuple[str, int], Any] = {}
  for blk in graph.blocks:
    by_kind[(blk.kind, forward_of[blk.id])] = blk
  forward_ids = {i: by_kind[("F", i)].id for i in range(len(part.blocks))}
  has_grad = {i: train and ("B", i) in by_kind for i in range(len(part.blocks))}
  split_w = {i: train and ("W", i) in by_kind for i in range(len(part.blocks))}

  terminals = tuple(("y", t.index, t.output) for t in part.epilogue.terminals)
  terminal_index = {key: j for j, key in enumerate(terminals)}

  value_avals: dict[Key, Any] = {}
  value_split: dict[Key, bool] = {}
  kernels: dict[int, Kernel] = {}
  # Consumers of every forward output: (block j, input position p).
  consumers: dict[Key, list[tuple[int, int]]] = {}
  for fb in part.blocks:
    for p, src in enumerate(fb.inputs):
      if src.kind == "act":
        consumers.setdefault(("y", src.index, src.output), []).append(
            (fb.index, p))

  for fb in part.blocks:
    i = fb.index
    fblk = by_kind[("F", i)]
    devices = tuple(fblk.devices)
    g = len(devices)
    if g > 1 and b % g:
      raise fail(name, f"block {i} runs on {g} devices {list(devices)} and"
                 f" shares each micro-batch's {b} rows among them, but {b} is"
                 f" not divisible by {g}; pick a batch size / num_microbatches"
                 f" giving a micro-batch of a multiple of {g} rows")
    if g > 1:
      full_fb = fb
      fb = _local_block(name, full_fb, (local_parts or {}).get(g), g)
      in_split = tuple(
          bool(a.shape) and a.shape[0] == b and la.shape[0] == b // g and
          s.kind in ("batch", "act")
          for s, a, la in zip(full_fb.inputs, full_fb.in_avals, fb.in_avals))
      local_in = tuple(fb.in_avals)
      fb_full_out = full_fb.out_avals
    else:
      in_split = (False,) * len(fb.inputs)
      local_in = tuple(fb.in_avals)
      fb_full_out = fb.out_avals
    local_out = tuple(fb.out_avals)
    out_split = tuple(
        g > 1 and bool(full.shape) and full.shape[0] == b and
        loc.shape[0] == b // g
        for full, loc in zip(fb_full_out, local_out))
    dependent = _batch_dependent(fb, in_split) if g > 1 else [False] * len(
        fb.out_avals)
    for k, (full, split, dep) in enumerate(zip(fb_full_out, out_split,
                                               dependent)):
      key = ("y", i, k)
      value_avals[key] = full
      value_split[key] = split
      if g > 1 and dep and not split and key in consumers:
        raise fail(
            name,
            f"block {i} runs on {g} devices and shares each micro-batch along"
            f" the batch axis (axis 0, {b} rows), but its output {k} of shape"
            f" {tuple(full.shape)} depends on the batch without having that"
            f" axis, so the devices' partial results cannot be passed on;"
            f" place block {i} on one device or make its outputs keep the"
            f" batch axis")

    params = tuple(dict.fromkeys(s.index for s in fb.inputs if s.kind == "param"))
    ins: list[InRef] = []
    for s in fb.inputs:
      if s.kind == "batch":
        ins.append(InRef("batch", leaf=s.index))
      elif s.kind == "act":
        ins.append(InRef("value", key=("y", s.index, s.output)))
      else:
        ins.append(InRef("param", leaf=s.index))
    param_pos = [p for p, r in enumerate(ins) if r.kind == "param"]
    data_pos = [p for p, r in enumerate(ins) if r.kind != "param"]
    data_ins = tuple(ins[p] for p in data_pos)
    data_avals = tuple(local_in[p] for p in data_pos)
    data_split = tuple(in_split[p] for p in data_pos)
    out_keys = tuple(("y", i, k) for k in range(len(fb.out_avals)))

    def assemble(pvals: Sequence[Any], dvals: Sequence[Any], *,
                 param_pos=param_pos, data_pos=data_pos, params=params,
                 ins=ins) -> list[Any]:
      vals: list[Any] = [None] * len(ins)
      by_leaf = dict(zip(params, pvals))
      for p in param_pos:
        vals[p] = by_leaf[ins[p].leaf]
      for p, v in zip(data_pos, dvals):
        vals[p] = v
      return vals

    if not has_grad[i]:
      def f_plain(ctx, pvals, dvals, fb=fb, assemble=assemble):
        del ctx
        return fb(*assemble(pvals, dvals)), []
      kernels[fblk.id] = Kernel(
          block_id=fblk.id, label=f"F{i}", kind="F", fwd=i, devices=devices,
          split=g, params=params, inputs=data_ins, in_avals=data_avals,
          in_split=data_split, outputs=out_keys, out_avals=local_out,
          out_split=out_split, grads=(), fn=f_plain)
      continue

    # --- training kernels of a block with a gradient -----------------------
    diff_pos = []  # positions in fb inputs that get cotangents
    for p, (r, a) in enumerate(zip(ins, local_in)):
      if r.kind == "param" and _inexact(a):
        diff_pos.append(p)
      elif r.kind == "value" and _inexact(a) and has_grad[r.key[1]]:
        if g > 1 and not in_split[p]:
          raise fail(
              name,
              f"block {i} runs on {g} devices and shares each micro-batch"
              f" along the batch axis, but it reads a differentiable"
              f" activation of shape {tuple(local_in[p].shape)} from"
              f" block {r.key[1]} without that axis; its gradient would need"
              f" a sum across the devices. Place block {i} on one device or"
              f" keep the batch axis on the values it reads")
        diff_pos.append(p)
    grad_leaves = tuple(ins[p].leaf for p in diff_pos if ins[p].kind == "param")
    act_diff = [p for p in diff_pos if ins[p].kind == "value"]
    keep_i = keep.get(i, True)

    def vjp_of(pvals, dvals, *, fb=fb, assemble=assemble, diff_pos=diff_pos):
      vals = assemble(pvals, dvals)
      def f(*diff):
        v = list(vals)
        for p, x in zip(diff_pos, diff):
          v[p] = x
        return fb(*v)
      return jax.vjp(f, *[vals[p] for p in diff_pos]), vals

    res = _Residuals()
    if keep_i:
      def probe(pvals, dvals, *, res=res, vjp_of=vjp_of, diff_pos=diff_pos,
                ins=ins):
        (ys, vjp), vals = vjp_of(pvals, dvals)
        leaves, treedef = jax.tree_util.tree_flatten(vjp)
        alias = []
        for leaf in leaves:
          hit = None
          for q, p in enumerate(diff_pos):
            if ins[p].kind == "param" and leaf is vals[p]:
              hit = q
              break
          alias.append(hit)
        res.treedef = treedef
        res.alias = tuple(alias)
        kept = [leaf for leaf, a in zip(leaves, alias) if a is None]
        return kept
      pv = [fb.in_avals[[q for q in param_pos if ins[q].leaf == l][0]]
            for l in params]
      kept = jax.eval_shape(probe, pv, list(data_avals))
      res.avals = tuple(_sds(a.shape, a.dtype) for a in kept)
      res_avals = res.avals
    else:
      res_avals = data_avals
    res_keys = tuple(("r", i, r) for r in range(len(res_avals)))
    for key, a in zip(res_keys, res_avals):
      value_avals[key] = a  # local; residuals never leave their device
      value_split[key] = False

    if keep_i:
      def f_train(ctx, pvals, dvals, *, res=res, vjp_of=vjp_of):
        del ctx
        (ys, vjp), _ = vjp_of(pvals, dvals)
        leaves = jax.tree_util.tree_leaves(vjp)
        if len(leaves) != len(res.alias):
          raise AssertionError("vjp residual structure changed between traces")
        kept = [leaf for leaf, a in zip(leaves, res.alias) if a is None]
        return list(ys) + kept, []
    else:
      def f_train(ctx, pvals, dvals, *, fb=fb, assemble=assemble):
        del ctx
        return list(fb(*assemble(pvals, dvals))) + list(dvals), []
    kernels[fblk.id] = Kernel(
        block_id=fblk.id, label=f"F{i}", kind="F", fwd=i, devices=devices,
        split=g, params=params, inputs=data_ins, in_avals=data_avals,
        in_split=data_split, outputs=out_keys + res_keys,
        out_avals=local_out + tuple(res_avals),
        out_split=out_split + (False,) * len(res_keys), grads=(), fn=f_train)

    # Cotangent contributions per output: consumers with a gradient, plus
    # the terminal seed.
    full_out = fb_full_out
    cot_in: list[InRef] = []
    cot_slot: list[int] = []      # which output each contribution adds to
    cot_avals: list[Any] = []
    cot_split: list[bool] = []
    for k, full in enumerate(full_out):
      if not _inexact(full):
        continue
      for (j, p) in consumers.get(("y", i, k), []):
        if has_grad[j]:
          cot_in.append(InRef("value", key=("c", j, p)))
          cot_slot.append(k)
          cot_avals.append(local_out[k])
          cot_split.append(out_split[k])
    seed_of: dict[int, Any] = {}
    for k in range(len(fb.out_avals)):
      j = terminal_index.get(("y", i, k))
      if j is not None and seeds is not None and seeds[j] is not None:
        seed_of[k] = seeds[j]

    res_in = tuple(InRef("value", key=key) for key in res_keys)
    b_inputs = res_in + tuple(cot_in)
    b_avals = tuple(res_avals) + tuple(cot_avals)
    b_split = (False,) * len(res_keys) + tuple(cot_split)

    def ybar_of(ctx, cots, *, fb=fb, local_out=local_out, cot_slot=cot_slot,
                seed_of=seed_of, out_split=out_split, g=g):
      bars: list[Any] = [None] * len(local_out)
      for k, c in zip(cot_slot, cots):
        bars[k] = c if bars[k] is None else bars[k] + c
      for k, seed in seed_of.items():
        aval = local_out[k]
        s = jnp.asarray(seed, aval.dtype)
        if out_split[k]:
          s = jax.lax.dynamic_slice_in_dim(s, ctx["row_offset"], aval.shape[0])
        elif g > 1:
          s = s / g
        bars[k] = s if bars[k] is None else bars[k] + s
      return [_zero_cot(a) if x is None else x
              for a, x in zip(local_out, bars)]

    def apply_vjp(ctx, pvals, rvals, ybar, *, keep_i=keep_i, res=res,
                  vjp_of=vjp_of, params=params, diff_pos=diff_pos, ins=ins):
      if keep_i:
        by_leaf = dict(zip(params, pvals))
        it = iter(rvals)
        leaves = [next(it) if a is None else by_leaf[ins[diff_pos[a]].leaf]
                  for a in res.alias]
        vjp = jax.tree_util.tree_unflatten(res.treedef, leaves)
      else:
        (_, vjp), _ = vjp_of(pvals, rvals)
      return vjp(_as_cot(ybar))

    def split_grads(bars, *, diff_pos=diff_pos, ins=ins):
      acts = [x for p, x in zip(diff_pos, bars) if ins[p].kind == "value"]
      grads = [x for p, x in zip(diff_pos, bars) if ins[p].kind == "param"]
      return acts, grads

    bblk = by_kind[("B", i)]
    cot_keys = tuple(("c", i, p) for p in act_diff)
    cot_out_avals = tuple(local_in[p] for p in act_diff)
    cot_out_split = tuple(in_split[p] for p in act_diff)
    for key, p in zip(cot_keys, act_diff):
      value_avals[key] = value_avals[ins[p].key]
      value_split[key] = in_split[p]
    nres = len(res_keys)
    if not split_w[i]:
      def b_fn(ctx, pvals, ivals, *, nres=nres, ybar_of=ybar_of,
               apply_vjp=apply_vjp, split_grads=split_grads):
        ybar = ybar_of(ctx, ivals[nres:])
        acts, grads = split_grads(apply_vjp(ctx, pvals, ivals[:nres], ybar))
        return list(acts), list(grads)
      kernels[bblk.id] = Kernel(
          block_id=bblk.id, label=f"B{i}", kind="B", fwd=i, devices=devices,
          split=g, params=params, inputs=b_inputs, in_avals=b_avals,
          in_split=b_split, outputs=cot_keys, out_avals=cot_out_avals,
          out_split=cot_out_split, grads=grad_leaves, fn=b_fn)
    else:
      bar_keys = tuple(("g", i, k) for k in range(len(local_out)))
      for key, full, s in zip(bar_keys, full_out, out_split):
        value_avals[key] = full
        value_split[key] = s
      def bw_fn(ctx, pvals, ivals, *, nres=nres, ybar_of=ybar_of,
                apply_vjp=apply_vjp, split_grads=split_grads):
        ybar = ybar_of(ctx, ivals[nres:])
        acts, _ = split_grads(apply_vjp(ctx, pvals, ivals[:nres], ybar))
        return list(acts) + [y for y in ybar if _inexact(y)], []
      bar_inexact = tuple(k for k, a in enumerate(local_out) if _inexact(a))
      kernels[bblk.id] = Kernel(
          block_id=bblk.id, label=f"B{i}", kind="B", fwd=i, devices=devices,
          split=g, params=params, inputs=b_inputs, in_avals=b_avals,
          in_split=b_split,
          outputs=cot_keys + tuple(bar_keys[k] for k in bar_inexact),
          out_avals=cot_out_avals + tuple(local_out[k] for k in bar_inexact),
          out_split=cot_out_split + tuple(out_split[k] for k in bar_inexact),
          grads=(), fn=bw_fn)
      wblk = by_kind[("W", i)]

      def w_fn(ctx, pvals, ivals, *, nres=nres, apply_vjp=apply_vjp,
               split_grads=split_grads, local_out=local_out,
               bar_inexact=bar_inexact):
        bars = [_zero_cot(a) for a in local_out]
        for k, v in zip(bar_inexact, ivals[nres:]):
          bars[k] = v
        _, grads = split_grads(apply_vjp(ctx, pvals, ivals[:nres], bars))
        return [], list(grads)
      kernels[wblk.id] = Kernel(
          block_id=wblk.id, label=f"W{i}", kind="W", fwd=i, devices=devices,
          split=g, params=params,
          inputs=res_in + tuple(InRef("value", key=bar_keys[k])
                                for k in bar_inexact),
          in_avals=tuple(res_avals) + tuple(local_out[k] for k in bar_inexact),
          in_split=(False,) * nres + tuple(out_split[k] for k in bar_inexact),
          outputs=(), out_avals=(), out_split=(), grads=grad_leaves, fn=w_fn)

  terminal_avals = tuple(value_avals[key] for key in terminals)
  return KernelSet(kernels=kernels, forward_ids=forward_ids,
                   terminals=terminals, terminal_avals=terminal_avals,
                   microbatch_rows=b, value_avals=value_avals,
                   value_split=value_split,
                   keep={i: keep.get(i, True) for i in range(len(part.blocks))},
                   train=train)


def _as_cot(ybar: Sequence[Any]) -> Any:
  """Cotangent structure of a block's output list (``fb`` returns a list)."""
  return list(ybar)


def loss_seeds(part: Partition, num_microbatches: int,
               check_affine: bool = True) -> list[Any]:
  """Constant cotangent of the mean loss with respect to each terminal.

  The loss is ``mean_m E(terminals(m))``; for an affine epilogue ``E`` the
  cotangent of terminal ``j`` of every micro-batch is ``dE/dt_j / N``. With
  ``has_aux`` only the loss output is differentiated (aux outputs get no
  seed, as ``jax.value_and_grad(has_aux=True)`` treats them) and only its
  part of the epilogue must be affine; terminals the loss does not read get
  ``None``.

  Raises:
    TesselError: if the loss is not a scalar float, or the epilogue is not
      affine in the block outputs it combines.
  """
  name = part.fn_name
  primary = part.primary_outputs
  outs = [part.out_avals[o] for o in primary]
  if len(outs) != 1 or outs[0].shape != () or not _float(outs[0]):
    raise fail(name, _loss_problem(part, outs))
  epi = part.epilogue
  avals = [jax.ShapeDtypeStruct(a.aval.shape, a.aval.dtype) for a in epi.invars]
  scale = 1.0 / num_microbatches
  if epi.is_identity:
    return [np.asarray(scale, avals[0].dtype)] + [None] * (len(avals) - 1)
  loss_epi = epi.select(primary)
  used = set(epi.reads(primary))
  rng = np.random.default_rng(0)
  g1 = _epilogue_grads(loss_epi, avals, used, rng, 0.0)
  if check_affine:
    g2 = _epilogue_grads(loss_epi, avals, used, rng, 3.0)
    for a, b in zip(g1, g2):
      if a is not None and not np.allclose(a, b, rtol=1e-5, atol=1e-6):
        raise fail(
            name,
            "the loss combines outputs of blocks the placement runs"
            " independently (no edge between them) in a way that is not"
            " affine (e.g. a product or a nonlinearity of two blocks'"
            " losses); the pipeline can only seed the backward of each"
            " block with a constant. Combine them by a (weighted) sum, or"
            " compute the nonlinear part inside one block")
  return [None if x is None else (x * scale).astype(a.dtype)
          for x, a in zip(g1, avals)]


def _loss_problem(part: Partition, outs: Sequence[Any]) -> str:
  """What is wrong with a training function's outputs, and the fix."""
  shapes = [f"{tuple(a.shape)}:{a.dtype}" for a in outs]
  if part.traced.has_aux:
    return (f"mode='train' with has_aux=True needs fn to return (loss, aux)"
            f" with a scalar float loss; its loss is {shapes}. Return the"
            f" scalar loss first (e.g. a mean over the micro-batch) and put"
            f" everything else in aux, or use mode='infer'")
  tree = part.traced.out_tree
  top = jax.tree_util.tree_unflatten(tree, list(range(tree.num_leaves)))
  hint = (" If fn returns (loss, aux), pass has_aux=True."
          if isinstance(top, tuple) and len(top) == 2 else "")
  return (f"mode='train' needs the function to return one scalar float loss;"
          f" it returns {shapes}. Return the loss only, or use mode='infer'"
          f" to get the outputs.{hint}")


def _epilogue_grads(epi: Any, avals: Sequence[Any], used: set[int],
                    rng: np.random.Generator,
                    shift: float) -> list[np.ndarray | None]:
  """Gradient of the epilogue's first output at random terminal values
  (``None`` for terminals it does not read or that are not float)."""
  diff = [k for k, a in enumerate(avals) if _float(a) and k in used]
  if not diff:
    return [None] * len(avals)
  with jax.ensure_compile_time_eval():
    xs = [jnp.asarray(rng.standard_normal(a.shape) + shift, a.dtype)
          if _float(a) else jnp.zeros(a.shape, a.dtype) for a in avals]

    def e(*d):
      v = list(xs)
      for k, x in zip(diff, d):
        v[k] = x
      return epi(*v)[0]
    gs = jax.grad(e, argnums=tuple(range(len(diff))))(*[xs[k] for k in diff])
  out: list[Any] = [None] * len(avals)
  for k, gk in zip(diff, gs):
    out[k] = np.asarray(gk)
  return out


def _float(aval: Any) -> bool:
  """A float (or complex) aval: one the loss can be differentiated by."""
  return jnp.issubdtype(aval.dtype, jnp.inexact)
