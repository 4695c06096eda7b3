"""Backward derivation: one kernel per placement block (F, B, W).

A kernel is what one device runs when the schedule starts a block on it:
``fn(ctx, params, inputs) -> (outputs, grads)`` on *local* values. A block on
``g`` devices either splits the micro-batch's rows (each device taking
``b / g`` rows) or, when its work couples rows (batch statistics, random
draws over the batch, ...) or the rows do not divide, runs replicated: every
device computes all rows and only the block's first device (its leader)
counts parameter gradients and terminals (``passes.modes``).

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
``k`` of block ``i`` (B -> W); ``("h", i, k)`` value ``k`` that ``B`` hands
``W`` when they share work (``passes.w_split``; local, like residuals).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from .block_vjp import Vjp, Ybar, inexact, leader_only, sds, zero_cot
from .errors import fail
from .modes import BlockMode, choose_modes
from .partition import ForwardBlock, Partition
from . import conv_forms as _conv_forms
from . import row_dots as _row_dots
from . import w_split

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
    split: Row split factor (``len(devices)`` for a split block, else 1).
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
      ``row_offset``: for a split kernel the first batch row of this
      device, for a replicated one the device's rank in the block (traced
      int; 0 on the leader either way).
    mode: ``"single"``, ``"split"`` or ``"replicated"`` (``passes.modes``).
    summed: ``(output, r)`` of outputs that are partial sums over the rows
      (split blocks): every device's value counts, times ``r``.
    rewrites: Rewrites of its block's equations that change its work but
      not its block's jaxpr (``("row_dots",)``: ``passes.row_dots``); part
      of its cost-cache key.
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
  mode: str = "single"
  summed: tuple[tuple[int, float], ...] = ()
  rewrites: tuple[str, ...] = ()

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
    modes: Per forward index: how its block runs on its devices.
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
  modes: Mapping[int, BlockMode] = dataclasses.field(default_factory=dict)

  def producer(self, key: Key) -> Kernel:
    for k in self.kernels.values():
      if key in k.outputs:
        return k
    raise KeyError(key)


def _nbytes(aval: Any) -> int:
  return int(np.prod(aval.shape, dtype=np.int64)) * np.dtype(aval.dtype).itemsize


@dataclasses.dataclass(frozen=True, eq=False)
class _Graph:
  """Placement facts every block's kernels need.

  Attributes:
    by_kind: ``(kind, forward index)`` -> placement block.
    forward_ids: Forward index -> graph id of its ``F`` block.
    has_grad: Forward index -> it has a ``B`` block (train only).
    split_w: Forward index -> it has a ``W`` block.
    consumers: ``("y", i, k)`` -> ``(block j, input position p)`` readers.
    terminal_index: Terminal key -> position.
  """

  by_kind: Mapping[tuple[str, int], Any]
  forward_ids: Mapping[int, int]
  has_grad: Mapping[int, bool]
  split_w: Mapping[int, bool]
  consumers: Mapping[Key, list[tuple[int, int]]]
  terminal_index: Mapping[Key, int]


def _index_graph(part: Partition, graph: Any, train: bool,
                 forward_of: Mapping[int, int]) -> _Graph:
  by_kind = {(blk.kind, forward_of[blk.id]): blk for blk in graph.blocks}
  n = len(part.blocks)
  consumers: dict[Key, list[tuple[int, int]]] = {}
  for fb in part.blocks:
    for p, src in enumerate(fb.inputs):
      if src.kind == "act":
        consumers.setdefault(("y", src.index, src.output), []).append(
            (fb.index, p))
  terminals = [("y", t.index, t.output) for t in part.epilogue.terminals]
  return _Graph(
      by_kind=by_kind,
      forward_ids={i: by_kind[("F", i)].id for i in range(n)},
      has_grad={i: train and ("B", i) in by_kind for i in range(n)},
      split_w={i: train and ("W", i) in by_kind for i in range(n)},
      consumers=consumers,
      terminal_index={key: j for j, key in enumerate(terminals)})


@dataclasses.dataclass(frozen=True, eq=False)
class _Block:
  """One forward block as its kernels run it.

  Attributes:
    i: Forward index.
    fb: The block traced at the rows each device runs (``b / g`` when
      split, else ``b``).
    mode: Its :class:`BlockMode`.
    split: Row split factor (``g`` when split, else 1).
    ins: Inputs in ``fb`` order (params as ``InRef("param")``).
    params: Parameter leaves it reads (distinct, in order).
    local_in: Local input avals (``fb.in_avals``).
    in_split: Per input: the local value is this device's rows.
    full_out: Full (micro-batch) output avals.
    local_out: Local output avals.
    out_split: Per output: rows of a split value.
    rewrites: What rewrote ``fb``'s equations (``Kernel.rewrites``).
  """

  i: int
  fb: ForwardBlock
  mode: BlockMode
  split: int
  ins: tuple[InRef, ...]
  params: tuple[int, ...]
  local_in: tuple[Any, ...]
  in_split: tuple[bool, ...]
  full_out: tuple[Any, ...]
  local_out: tuple[Any, ...]
  out_split: tuple[bool, ...]
  rewrites: tuple[str, ...] = ()

  @property
  def devices(self) -> tuple[int, ...]:
    return self.mode.devices

  @property
  def data_pos(self) -> list[int]:
    return [p for p, r in enumerate(self.ins) if r.kind != "param"]

  @property
  def data_ins(self) -> tuple[InRef, ...]:
    return tuple(self.ins[p] for p in self.data_pos)

  @property
  def data_avals(self) -> tuple[Any, ...]:
    return tuple(self.local_in[p] for p in self.data_pos)

  @property
  def data_split(self) -> tuple[bool, ...]:
    return tuple(self.in_split[p] for p in self.data_pos)

  @property
  def out_keys(self) -> tuple[Key, ...]:
    return tuple(("y", self.i, k) for k in range(len(self.local_out)))

  def assemble(self, pvals: Sequence[Any], dvals: Sequence[Any]) -> list[Any]:
    """All inputs of ``fb`` from the parameter and data values."""
    vals: list[Any] = [None] * len(self.ins)
    by_leaf = dict(zip(self.params, pvals))
    for p, r in enumerate(self.ins):
      if r.kind == "param":
        vals[p] = by_leaf[r.leaf]
    for p, v in zip(self.data_pos, dvals):
      vals[p] = v
    return vals

  def kernel(self, gid: int, kind: str, **kw: Any) -> Kernel:
    """A :class:`Kernel` of this block (``kw``: inputs, outputs, fn...)."""
    return Kernel(block_id=gid, label=f"{kind}{self.i}", kind=kind,
                  fwd=self.i, devices=self.devices, split=self.split,
                  params=self.params, mode=self.mode.mode,
                  summed=self.mode.summed if kind == "F" else (),
                  rewrites=self.rewrites, **kw)


def _make_block(full: ForwardBlock, mode: BlockMode, b: int,
                local_parts: Mapping[int, Partition] | None,
                row_dots: tuple[bool, bool] = (False, False),
                conv_forms: bool = False) -> _Block:
  """The block as it runs under ``mode`` (the re-trace when split;
  ``row_dots``: its few-row dots rewritten, ``passes.row_dots``, and
  their forward too; ``conv_forms``: its convolutions in XLA:CPU's fast
  order, ``passes.conv_forms``)."""
  ins = tuple(InRef("batch", leaf=s.index) if s.kind == "batch" else
              InRef("value", key=("y", s.index, s.output)) if s.kind == "act"
              else InRef("param", leaf=s.index) for s in full.inputs)
  params = tuple(dict.fromkeys(s.index for s in full.inputs
                               if s.kind == "param"))
  g = len(mode.devices)
  fb, in_split, out_split = full, (False,) * len(ins), (False,) * len(
      full.out_avals)
  if mode.mode == "split":
    fb = (local_parts or {})[g].blocks[full.index]
    in_split = tuple(
        s.kind in ("batch", "act") and bool(a.shape) and a.shape[0] == b and
        la.shape[0] == b // g
        for s, a, la in zip(full.inputs, full.in_avals, fb.in_avals))
    out_split = tuple(bool(a.shape) and a.shape[0] == b and
                      la.shape[0] == b // g
                      for a, la in zip(full.out_avals, fb.out_avals))
  rewrites = ()
  if row_dots[0]:
    new = _row_dots.rewrite(fb, forward=row_dots[1])
    if new is not fb:
      fb, rewrites = new, ("row_dots_forward" if row_dots[1] else "row_dots",)
  if conv_forms:
    new = _conv_forms.rewrite(fb)
    if new is not fb:
      fb, rewrites = new, rewrites + ("conv_forms",)
  return _Block(rewrites=rewrites, i=full.index, fb=fb, mode=mode,
                split=g if mode.mode == "split" else 1, ins=ins, params=params,
                local_in=tuple(fb.in_avals), in_split=in_split,
                full_out=tuple(full.out_avals), local_out=tuple(fb.out_avals),
                out_split=out_split)


def build_kernels(part: Partition, graph: Any, *, train: bool,
                  microbatch_rows: int, keep: Mapping[int, bool] | None = None,
                  seeds: Sequence[Any] | None = None,
                  forward_of: Mapping[int, int] | None = None,
                  local_parts: Mapping[int, Partition] | None = None,
                  trim: bool = True, row_dots: bool = False,
                  row_dots_forward: bool = False,
                  conv_forms: bool = False,
                  shared_w: bool = False) -> KernelSet:
  """Builds every kernel for ``graph``.

  Each block on several devices is split by rows or replicated
  (``passes.modes``); the choice is in ``KernelSet.modes``.

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
      on ``b / g`` rows (jaxprs are shape-specialised, so a block split over
      ``g`` devices runs the equations traced at its local size).
    trim: Leave out of the stash the vjp residuals that ``B`` rebuilds
      cheaply (``passes.residual_trim``; ``Switches.residual_trim``).
    row_dots: Few-row dots against a weight take their input cotangent
      with the weight as the left operand (``passes.row_dots``;
      ``Switches.row_dots``); ``row_dots_forward``: their forward too.
    conv_forms: Convolutions bound in XLA:CPU's canonical order, forward
      and backward (``passes.conv_forms``; ``Switches.conv_forms``).
    shared_w: A split backward's ``W`` reads what ``B`` computes for both
      instead of recomputing it (``passes.w_split``;
      ``Switches.shared_w``).
  """
  b = microbatch_rows
  keep = dict(keep or {})
  if forward_of is None:
    from tessel_jax import placements  # pylint: disable=import-outside-toplevel
    forward_of = {blk.id: placements.forward_index(blk) for blk in graph.blocks}
  gi = _index_graph(part, graph, train, forward_of)
  modes = choose_modes(
      part, {i: tuple(gi.by_kind[("F", i)].devices) for i in gi.forward_ids},
      b, local_parts, gi.has_grad)
  ks = _Builder(gi, b, seeds, trim, shared_w)
  for full in part.blocks:
    blk = _make_block(full, modes[full.index], b, local_parts,
                      (row_dots, row_dots_forward), conv_forms)
    if gi.has_grad[blk.i]:
      ks.train_block(blk, keep.get(blk.i, True))
    else:
      ks.plain_block(blk)
  terminals = tuple(gi.terminal_index)
  return KernelSet(kernels=ks.kernels, forward_ids=gi.forward_ids,
                   terminals=terminals,
                   terminal_avals=tuple(ks.value_avals[k] for k in terminals),
                   microbatch_rows=b, value_avals=ks.value_avals,
                   value_split=ks.value_split,
                   keep={i: keep.get(i, True) for i in range(len(part.blocks))},
                   train=train, modes=modes)


class _Builder:
  """Accumulates kernels and value facts block by block."""

  def __init__(self, gi: _Graph, b: int, seeds: Sequence[Any] | None,
               trim: bool = True, shared_w: bool = False):
    self.gi = gi
    self.b = b
    self.seeds = seeds
    self.trim = trim
    self.shared_w = shared_w
    self.kernels: dict[int, Kernel] = {}
    self.value_avals: dict[Key, Any] = {}
    self.value_split: dict[Key, bool] = {}

  def _outputs(self, blk: _Block) -> None:
    for key, full, s in zip(blk.out_keys, blk.full_out, blk.out_split):
      self.value_avals[key] = full
      self.value_split[key] = s

  def plain_block(self, blk: _Block) -> None:
    """Inference (or no-gradient) ``F`` kernel."""
    self._outputs(blk)

    def f_plain(ctx, pvals, dvals, *, blk=blk):
      del ctx
      return blk.fb(*blk.assemble(pvals, dvals)), []
    fid = self.gi.forward_ids[blk.i]
    self.kernels[fid] = blk.kernel(
        fid, "F", inputs=blk.data_ins, in_avals=blk.data_avals,
        in_split=blk.data_split, outputs=blk.out_keys,
        out_avals=blk.local_out, out_split=blk.out_split, grads=(),
        fn=f_plain)

  def train_block(self, blk: _Block, keep: bool) -> None:
    """``F``, ``B`` and (split backward) ``W`` kernels of one block."""
    self._outputs(blk)
    diff_pos = [p for p, (r, a) in enumerate(zip(blk.ins, blk.local_in))
                if inexact(a) and (r.kind == "param" or (
                    r.kind == "value" and self.gi.has_grad[r.key[1]]))]
    vjp = Vjp(blk, diff_pos, keep, self.trim)
    res_avals = vjp.residual_avals()
    res_keys = tuple(("r", blk.i, r) for r in range(len(res_avals)))
    for key, a in zip(res_keys, res_avals):
      self.value_avals[key] = a  # local; residuals never leave their device
      self.value_split[key] = False
    fid = self.gi.forward_ids[blk.i]
    self.kernels[fid] = blk.kernel(
        fid, "F", inputs=blk.data_ins, in_avals=blk.data_avals,
        in_split=blk.data_split, outputs=blk.out_keys + res_keys,
        out_avals=blk.local_out + tuple(res_avals),
        out_split=blk.out_split + (False,) * len(res_keys), grads=(),
        fn=vjp.forward)
    self._backward(blk, vjp, res_keys, res_avals)

  def _cotangent_inputs(self, blk: _Block
                        ) -> tuple[list[InRef], list[int], list[Any],
                                   list[bool]]:
    """Cotangents of the block's outputs from consumers with a gradient."""
    cot_in, cot_slot, cot_avals, cot_split = [], [], [], []
    for k, full in enumerate(blk.full_out):
      if not inexact(full):
        continue
      for (j, p) in self.gi.consumers.get(("y", blk.i, k), []):
        if self.gi.has_grad[j]:
          cot_in.append(InRef("value", key=("c", j, p)))
          cot_slot.append(k)
          cot_avals.append(blk.local_out[k])
          cot_split.append(blk.out_split[k])
    return cot_in, cot_slot, cot_avals, cot_split

  def _seeds_of(self, blk: _Block) -> dict[int, Any]:
    out = {}
    for k in range(len(blk.local_out)):
      j = self.gi.terminal_index.get(("y", blk.i, k))
      if j is not None and self.seeds is not None and self.seeds[j] is not None:
        out[k] = self.seeds[j]
    return out

  def _backward(self, blk: _Block, vjp: "Vjp", res_keys: tuple[Key, ...],
                res_avals: Sequence[Any]) -> None:
    cot_in, cot_slot, cot_avals, cot_split = self._cotangent_inputs(blk)
    ybar = Ybar(blk, cot_slot, self._seeds_of(blk))
    act_diff = [p for p in vjp.diff_pos if blk.ins[p].kind == "value"]
    cot_keys = tuple(("c", blk.i, p) for p in act_diff)
    for key, p in zip(cot_keys, act_diff):
      self.value_avals[key] = self.value_avals[blk.ins[p].key]
      self.value_split[key] = blk.in_split[p]
    res_in = tuple(InRef("value", key=key) for key in res_keys)
    nres = len(res_keys)
    common = dict(inputs=res_in + tuple(cot_in),
                  in_avals=tuple(res_avals) + tuple(cot_avals),
                  in_split=(False,) * nres + tuple(cot_split))
    cot_avals_out = tuple(blk.local_in[p] for p in act_diff)
    cot_split_out = tuple(blk.in_split[p] for p in act_diff)
    bid = self.gi.by_kind[("B", blk.i)].id
    if self.gi.split_w[blk.i] and self.shared_w:
      self._shared_split(blk, vjp, ybar, res_in, common, cot_keys,
                         cot_avals_out, cot_split_out)
      return
    if not self.gi.split_w[blk.i]:
      def b_fn(ctx, pvals, ivals, *, nres=nres, ybar=ybar, vjp=vjp):
        bars = ybar(ctx, ivals[nres:])
        acts, grads = vjp.backward(ctx, pvals, ivals[:nres], bars)
        return acts, grads
      self.kernels[bid] = blk.kernel(
          bid, "B", outputs=cot_keys, out_avals=cot_avals_out,
          out_split=cot_split_out, grads=vjp.grad_leaves, fn=b_fn, **common)
      return
    bar_keys = tuple(("g", blk.i, k) for k in range(len(blk.local_out)))
    for key, full, s in zip(bar_keys, blk.full_out, blk.out_split):
      self.value_avals[key] = full
      self.value_split[key] = s
    bar_inexact = tuple(k for k, a in enumerate(blk.local_out) if inexact(a))

    def bw_fn(ctx, pvals, ivals, *, nres=nres, ybar=ybar, vjp=vjp):
      bars = ybar(ctx, ivals[nres:])
      acts, _ = vjp.backward(ctx, pvals, ivals[:nres], bars, grads=False)
      return acts + [y for y in bars if inexact(y)], []
    self.kernels[bid] = blk.kernel(
        bid, "B", outputs=cot_keys + tuple(bar_keys[k] for k in bar_inexact),
        out_avals=cot_avals_out + tuple(blk.local_out[k] for k in bar_inexact),
        out_split=cot_split_out + tuple(blk.out_split[k] for k in bar_inexact),
        grads=(), fn=bw_fn, **common)

    def w_fn(ctx, pvals, ivals, *, nres=nres, vjp=vjp, blk=blk,
             bar_inexact=bar_inexact):
      bars = [zero_cot(a) for a in blk.local_out]
      for k, v in zip(bar_inexact, ivals[nres:]):
        bars[k] = v
      _, grads = vjp.backward(ctx, pvals, ivals[:nres], bars, acts=False)
      return [], grads
    wid = self.gi.by_kind[("W", blk.i)].id
    self.kernels[wid] = blk.kernel(
        wid, "W", inputs=res_in + tuple(InRef("value", key=bar_keys[k])
                                        for k in bar_inexact),
        in_avals=tuple(res_avals) + tuple(blk.local_out[k]
                                          for k in bar_inexact),
        in_split=(False,) * nres + tuple(blk.out_split[k]
                                         for k in bar_inexact),
        outputs=(), out_avals=(), out_split=(), grads=vjp.grad_leaves,
        fn=w_fn)

  def _shared_split(self, blk: _Block, vjp: "Vjp", ybar: Ybar,
                    res_in: tuple[InRef, ...], common: dict[str, Any],
                    cot_keys: tuple[Key, ...], cot_avals_out: tuple[Any, ...],
                    cot_split_out: tuple[bool, ...]) -> None:
    """``B`` and ``W`` of a split backward sharing work
    (``passes.w_split``): ``B`` hands ``W`` the values both need
    (``("h", i, k)`` keys, local like residuals) and ``W`` reads only the
    residuals its own equations need."""
    nres = len(res_in)
    split = w_split.find(vjp.backward_jaxpr(), len(blk.params), nres,
                         len(cot_keys))
    h_keys = tuple(("h", blk.i, k) for k in range(len(split.handoff)))
    h_avals = tuple(sds(a.shape, a.dtype) for a in split.handoff_avals)
    for key, a in zip(h_keys, h_avals):
      self.value_avals[key] = a  # local; B and W run on the same devices
      self.value_split[key] = False

    def bw_fn(ctx, pvals, ivals, *, nres=nres, ybar=ybar, split=split):
      bars = [y for y in ybar(ctx, ivals[nres:]) if inexact(y)]
      acts, handoff = split.run_b(pvals, ivals[:nres], bars)
      return acts + handoff, []
    bid = self.gi.by_kind[("B", blk.i)].id
    self.kernels[bid] = blk.kernel(
        bid, "B", outputs=cot_keys + h_keys,
        out_avals=cot_avals_out + h_avals,
        out_split=cot_split_out + (False,) * len(h_keys),
        grads=(), fn=bw_fn, **common)

    def w_fn(ctx, pvals, ivals, *, split=split, blk=blk):
      nw = len(split.w_res)
      grads = split.run_w(pvals, ivals[:nw], ivals[nw:])
      if blk.mode.mode == "replicated":
        grads = [leader_only(ctx, x) for x in grads]
      return [], grads
    wid = self.gi.by_kind[("W", blk.i)].id
    res_avals = common["in_avals"][:nres]
    self.kernels[wid] = blk.kernel(
        wid, "W",
        inputs=tuple(res_in[k] for k in split.w_res) + tuple(
            InRef("value", key=k) for k in h_keys),
        in_avals=tuple(res_avals[k] for k in split.w_res) + h_avals,
        in_split=(False,) * (len(split.w_res) + len(h_keys)),
        outputs=(), out_avals=(), out_split=(), grads=vjp.grad_leaves,
        fn=w_fn)


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
