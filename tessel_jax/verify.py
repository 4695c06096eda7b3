"""``step.verify``: the lowered program against the plain function.

::

    report = step.verify(params, batch)
    print(report)            # max error per leaf; the first block that differs
    assert report.ok

The pipelined step's results are compared with ``jax.value_and_grad`` of
the mean of ``fn`` over the micro-batches (training) or with ``fn``'s
outputs per micro-batch (inference), leaf by leaf. When a leaf differs, the
blocks are checked one by one on micro-batch 0: every kernel (``F``, then
``B`` and ``W`` in backward order) runs alone on every device of its block,
on the plain function's intermediate values (forward activations; output
cotangents from ``jax.vjp`` of each block of the plain function), and its
outputs and parameter gradients are compared with the plain function's. The
first kernel that differs is named; when none does, the difference lies in
the schedule's lowering (communication, stash, accumulation).
"""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

TINY = 1e-30


@dataclasses.dataclass(frozen=True)
class LeafCheck:
  """One output leaf: largest absolute and relative (to ``max|want|``)
  error."""

  path: str
  max_abs: float
  max_rel: float
  ok: bool


@dataclasses.dataclass(frozen=True)
class BlockCheck:
  """One kernel run alone on the plain function's intermediate values.

  Attributes:
    label: ``F3``, ``B3`` or ``W3``.
    what: The output that differs most (``"output 0"``, ``"input cotangent
      1"``, ``"gradient of params['w']"``) or ``""``.
    max_rel: Its relative error.
    ok: Within ``rtol``.
  """

  label: str
  what: str
  max_rel: float
  ok: bool


@dataclasses.dataclass(frozen=True)
class VerifyReport:
  """What :func:`verify` found.

  Attributes:
    fn_name: The scheduled function.
    mode: ``"train"`` or ``"infer"``.
    num_microbatches: N of the program checked.
    rtol: Tolerance on ``max|got - want| / max|want|`` per leaf.
    leaves: Every output leaf (loss, gradients or outputs).
    blocks: Kernels checked alone (empty when every leaf matched).
  """

  fn_name: str
  mode: str
  num_microbatches: int
  rtol: float
  leaves: tuple[LeafCheck, ...]
  blocks: tuple[BlockCheck, ...] = ()

  @property
  def ok(self) -> bool:
    return all(l.ok for l in self.leaves)

  @property
  def first_bad_block(self) -> str | None:
    """Label of the first kernel (forward order, then backward) that
    differs, or None."""
    bad = [b for b in self.blocks if not b.ok]
    return bad[0].label if bad else None

  @property
  def max_rel(self) -> float:
    return max((l.max_rel for l in self.leaves), default=0.0)

  def __str__(self) -> str:
    ref = ("jax.value_and_grad" if self.mode == "train" else
           "the plain function")
    head = (f"verify {self.fn_name!r} ({self.mode}, N ="
            f" {self.num_microbatches}) against {ref}, rtol {self.rtol:g}:"
            f" {'OK' if self.ok else 'DIFFERS'}")
    width = max((len(l.path) for l in self.leaves), default=4)
    lines = [head, f"  {'leaf':<{width}}  max abs err  max rel err"]
    for l in self.leaves:
      flag = "" if l.ok else "  <-- differs"
      lines.append(f"  {l.path:<{width}}  {l.max_abs:11.3e}  {l.max_rel:11.3e}"
                   f"{flag}")
    if not self.ok:
      lines.append(self._block_summary())
    return "\n".join(lines)

  def _block_summary(self) -> str:
    first = self.first_bad_block
    if first is None:
      return ("  every kernel matches the plain function when run alone on"
              " micro-batch 0: the difference comes from the lowered"
              " schedule (communication, stash slots or accumulation), not"
              " from a block")
    bad = next(b for b in self.blocks if b.label == first)
    return (f"  first block that differs: {first} ({bad.what}, max rel err"
            f" {bad.max_rel:.3e}) when run alone on the plain function's"
            f" values of micro-batch 0")


def rel_err(got: Any, want: Any) -> tuple[float, float]:
  """``(max|a - b|, max|a - b| / max|b|)`` in float64 (inf on a shape
  mismatch)."""
  a = np.asarray(got, np.float64)
  b = np.asarray(want, np.float64)
  if a.shape != b.shape:
    return float("inf"), float("inf")
  if a.size == 0:
    return 0.0, 0.0
  err = float(np.max(np.abs(a - b)))
  return err, err / max(float(np.max(np.abs(b))), TINY)


def _stacked_microbatches(batch: Any, n: int) -> Any:
  return jax.tree_util.tree_map(
      lambda x: jnp.reshape(x, (n, -1) + tuple(x.shape[1:])), batch)


def _split_microbatches(batch: Any, n: int) -> list[Any]:
  mbs = _stacked_microbatches(batch, n)
  return [jax.tree_util.tree_map(lambda x, m=m: x[m], mbs) for m in range(n)]


def _concat(tree: Any) -> Any:
  """``(N, rows, ...)`` leaves -> ``(N * rows, ...)``; scalars stay ``(N,)``."""
  return jax.tree_util.tree_map(
      lambda x: x.reshape((-1,) + tuple(x.shape[2:])) if x.ndim > 1 else x,
      tree)


def reference(fn: Any, params: Any, batch: Any, n: int, mode: str,
              has_aux: bool) -> Any:
  """What the step must return, from the plain ``fn`` (one ``jax.jit`` over
  a ``lax.map`` of the micro-batches).

  Training: ``jax.value_and_grad`` of the mean of ``fn`` over ``n``
  micro-batches (with ``has_aux``: ``((loss, aux stacked), grads)``).
  Inference: the outputs per micro-batch concatenated on axis 0 (scalars
  stacked); with ``has_aux`` ``(outputs, aux stacked)``.
  """
  mbs = _stacked_microbatches(batch, n)
  if mode == "train":
    def mean_loss(p: Any) -> Any:
      out = jax.lax.map(lambda mb: fn(p, mb), mbs)
      if not has_aux:
        return jnp.mean(out)
      return jnp.mean(out[0]), out[1]
    return jax.jit(jax.value_and_grad(mean_loss, has_aux=has_aux))(params)

  def outputs(p: Any) -> Any:
    out = jax.lax.map(lambda mb: fn(p, mb), mbs)
    return (_concat(out[0]), out[1]) if has_aux else _concat(out)
  return jax.jit(outputs)(params)


def compare_leaves(got: Any, want: Any, rtol: float) -> tuple[LeafCheck, ...]:
  """Per-leaf errors of ``got`` against ``want`` (paths from ``want``)."""
  paths = jax.tree_util.tree_flatten_with_path(want)[0]
  got_leaves = jax.tree_util.tree_leaves(got)
  if len(got_leaves) != len(paths):
    raise ValueError(f"the step returned {len(got_leaves)} leaves, the plain"
                     f" function {len(paths)}")
  out = []
  for (path, w), g in zip(paths, got_leaves):
    err, rel = rel_err(g, w)
    out.append(LeafCheck(path=jax.tree_util.keystr(path) or "(root)",
                         max_abs=err, max_rel=rel, ok=rel <= rtol))
  return tuple(out)


def verify(step: Any, params: Any, batch: Any, *, rtol: float = 1e-5,
           microbatches: int | None = None) -> VerifyReport:
  """Checks ``step`` (a ``ScheduledFunction``) on ``params, batch``.

  Args:
    step: The scheduled function.
    params: Parameters (may be smaller than the production ones: the
      program is built for these shapes).
    batch: A batch (its rows divide by the number of micro-batches).
    rtol: Largest accepted ``max|got - want| / max|want|`` per leaf.
    microbatches: N of the program checked (None: the step's own); another
      N builds a copy of the step with that N (same placement, plan, memory
      limit), so a small batch can be checked cheaply.

  Returns:
    A :class:`VerifyReport`; ``str(report)`` is a readable table.
  """
  if getattr(step, "auto", False):  # placement="auto": the plan it chose
    step.build(params, batch)
    step = step.choice.step
  if microbatches is not None and microbatches != step.num_microbatches:
    step = _with_microbatches(step, microbatches)
  n = int(step.num_microbatches)
  got = step(params, batch)
  want = reference(step.fn, params, batch, n, step.mode, step.has_aux)
  leaves = compare_leaves(got, want, rtol)
  blocks: tuple[BlockCheck, ...] = ()
  if not all(l.ok for l in leaves):
    blocks = check_blocks(step.built, params, _split_microbatches(batch, n)[0],
                          n, rtol, train=step.mode == "train")
  return VerifyReport(fn_name=step.fn_name, mode=step.mode,
                      num_microbatches=n, rtol=rtol, leaves=leaves,
                      blocks=blocks)


def _with_microbatches(step: Any, n: int) -> Any:
  """A copy of ``step`` that runs ``n`` micro-batches (own build cache)."""
  if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n < 1:
    raise step._error(f"verify(microbatches={n!r}): give an integer >= 1 or"
                      f" None for the step's own")
  other = copy.copy(step)
  other.num_microbatches = int(n)
  other._cache = {}  # pylint: disable=protected-access
  other._last = None  # pylint: disable=protected-access
  other._ran = set()  # pylint: disable=protected-access
  return other


# --- block by block -----------------------------------------------------------


def check_blocks(built: Any, params: Any, microbatch: Any, n: int,
                 rtol: float, train: bool) -> tuple[BlockCheck, ...]:
  """Every kernel of ``built`` alone against the plain function's values of
  one micro-batch (see the module docstring)."""
  part, ks = built.partition, built.kernels
  p_flat = jax.tree_util.tree_leaves(params)
  b_flat = jax.tree_util.tree_leaves(microbatch)
  ref = _PlainValues(part, p_flat, b_flat, n, train)
  runner = _KernelRunner(ks, p_flat, b_flat, ref, rtol)
  order = [ks.kernels[ks.forward_ids[i]] for i in sorted(ks.forward_ids)]
  if train:
    backward = sorted((k for k in ks.kernels.values() if k.kind != "F"),
                      key=lambda k: (-k.fwd, k.kind))
    order += backward
  return tuple(runner.check(k) for k in order)


class _PlainValues:
  """The plain function's intermediate values on one micro-batch.

  ``y[(i, k)]``: output ``k`` of forward block ``i``; training adds
  ``ybar[(i, k)]`` (the loss' cotangent, loss scaled by ``1/n``),
  ``cot[(i, p)]`` (cotangent of input ``p`` of block ``i``) and
  ``grads[i]`` (parameter leaf -> block ``i``'s gradient contribution).
  """

  def __init__(self, part: Any, p_flat: Sequence[Any],
               b_flat: Sequence[Any], n: int, train: bool):
    self.part = part
    self.p_flat, self.b_flat = p_flat, b_flat
    self.y: dict[tuple[int, int], Any] = {}
    for fb in part.blocks:
      for k, v in enumerate(fb(*self.inputs(fb))):
        self.y[(fb.index, k)] = v
    self.ybar: dict[tuple[int, int], Any] = {}
    self.cot: dict[tuple[int, int], Any] = {}
    self.grads: dict[int, dict[int, Any]] = {}
    if train:
      self._backward(n)

  def inputs(self, fb: Any) -> list[Any]:
    return [self.p_flat[s.index] if s.kind == "param" else
            self.b_flat[s.index] if s.kind == "batch" else
            self.y[(s.index, s.output)] for s in fb.inputs]

  def _add(self, key: tuple[int, int], v: Any) -> None:
    self.ybar[key] = v if key not in self.ybar else self.ybar[key] + v

  def _backward(self, n: int) -> None:
    part = self.part
    epi = part.epilogue.select(part.primary_outputs)
    terms = [self.y[(t.index, t.output)] for t in part.epilogue.terminals]
    diff = [j for j, t in enumerate(terms) if _inexact(t)]

    def loss(*xs: Any) -> Any:
      v = list(terms)
      for j, x in zip(diff, xs):
        v[j] = x
      return epi(*v)[0]
    _, vjp = jax.vjp(loss, *[terms[j] for j in diff])
    out = loss(*[terms[j] for j in diff])
    for j, c in zip(diff, vjp(jnp.asarray(1.0 / n, out.dtype))):
      t = part.epilogue.terminals[j]
      self._add((t.index, t.output), c)
    for fb in reversed(part.blocks):
      self._block_backward(fb)

  def _block_backward(self, fb: Any) -> None:
    vals = self.inputs(fb)
    diff = [p for p, (s, v) in enumerate(zip(fb.inputs, vals))
            if s.kind != "batch" and _inexact(v)]

    def f(*xs: Any) -> list[Any]:
      v = list(vals)
      for p, x in zip(diff, xs):
        v[p] = x
      return fb(*v)
    ys, vjp = jax.vjp(f, *[vals[p] for p in diff])
    bars = [self.ybar.get((fb.index, k), _zero(y)) for k, y in enumerate(ys)]
    grads: dict[int, Any] = {}
    for p, c in zip(diff, vjp(bars)):
      s = fb.inputs[p]
      if s.kind == "param":
        grads[s.index] = c if s.index not in grads else grads[s.index] + c
      else:
        self.cot[(fb.index, p)] = c
        self._add((s.index, s.output), c)
    self.grads[fb.index] = grads


def _inexact(x: Any) -> bool:
  return jnp.issubdtype(jnp.result_type(x), jnp.inexact)


def _zero(y: Any) -> Any:
  if _inexact(y):
    return jnp.zeros(jnp.shape(y), jnp.result_type(y))
  return np.zeros(jnp.shape(y), dtype=jax.dtypes.float0)


class _KernelRunner:
  """Runs kernels alone on every device of their block, on plain values."""

  def __init__(self, ks: Any, p_flat: Sequence[Any], b_flat: Sequence[Any],
               ref: _PlainValues, rtol: float):
    self.ks, self.p_flat, self.b_flat = ks, p_flat, b_flat
    self.ref, self.rtol = ref, rtol
    self.b = ks.microbatch_rows
    self.local: dict[tuple[Any, int], Any] = {}  # (key, device) -> value

  def _rows(self, kernel: Any, device: int) -> tuple[int, int]:
    g = kernel.split
    if g <= 1:
      return 0, self.b
    k = kernel.devices.index(device)
    return k * self.b // g, (k + 1) * self.b // g

  def _offset(self, kernel: Any, device: int) -> int:
    if kernel.mode == "replicated":
      return kernel.devices.index(device)
    return self._rows(kernel, device)[0]

  def _full_value(self, key: tuple) -> Any:
    if key[0] == "y":
      return self.ref.y[(key[1], key[2])]
    if key[0] == "c":
      return self.ref.cot[(key[1], key[2])]
    if key[0] == "g":
      return self.ref.ybar.get((key[1], key[2]))
    return None

  def _input(self, kernel: Any, j: int, device: int) -> Any:
    ref = kernel.inputs[j]
    lo, hi = self._rows(kernel, device)
    if ref.kind == "batch":
      full = self.b_flat[ref.leaf]
    elif ref.key[0] in ("r", "g", "h"):
      return self.local[(ref.key, device)]  # made by this block's F / B
    else:
      full = self._full_value(ref.key)
    return full[lo:hi] if kernel.in_split[j] else full

  def check(self, kernel: Any) -> BlockCheck:
    """Runs ``kernel`` on each of its devices and compares it."""
    outs, grads = [], []
    pvals = [self.p_flat[l] for l in kernel.params]
    for d in kernel.devices:
      ivals = [self._input(kernel, j, d) for j in range(len(kernel.inputs))]
      o, g = kernel.fn({"row_offset": self._offset(kernel, d)}, pvals, ivals)
      for key, v in zip(kernel.outputs, o):
        self.local[(key, d)] = v
      outs.append(o)
      grads.append(g)
    worst = ("", 0.0)
    for j, key in enumerate(kernel.outputs):
      want = self._full_value(key) if key[0] in ("y", "c") else None
      if want is None:
        continue
      got = self._combine(kernel, j, [o[j] for o in outs])
      worst = max(worst, (_describe_key(key), rel_err(got, want)[1]),
                  key=lambda t: t[1])
    if kernel.grads:
      worst = max(worst, self._grad_error(kernel, grads), key=lambda t: t[1])
    return BlockCheck(label=kernel.label, what=worst[0], max_rel=worst[1],
                      ok=worst[1] <= self.rtol)

  def _combine(self, kernel: Any, j: int, per_device: Sequence[Any]) -> Any:
    """The micro-batch value of output ``j`` from every device's copy."""
    if kernel.split > 1 and kernel.out_split[j]:
      return jnp.concatenate(per_device, axis=0)
    summed = dict(kernel.summed)
    if j in summed:
      return summed[j] * sum(per_device[1:], per_device[0])
    if kernel.split > 1 and kernel.outputs[j][0] == "c":
      return sum(per_device[1:], per_device[0])  # partial sums over rows
    return per_device[0]  # the leader's

  def _grad_error(self, kernel: Any,
                  per_device: Sequence[Sequence[Any]]) -> tuple[str, float]:
    got: dict[int, Any] = {}
    for g in per_device:
      for leaf, v in zip(kernel.grads, g):
        got[leaf] = v if leaf not in got else got[leaf] + v
    want = self.ref.grads.get(kernel.fwd, {})
    worst = ("", 0.0)
    for leaf, v in got.items():
      w = want.get(leaf)
      rel = rel_err(v, w)[1] if w is not None else float("inf")
      worst = max(worst, (f"gradient of parameter leaf {leaf}", rel),
                  key=lambda t: t[1])
    return worst


def _describe_key(key: tuple) -> str:
  if key[0] == "y":
    return f"output {key[2]}"
  return f"cotangent of input {key[2]}"


def describe(report: VerifyReport) -> Mapping[str, Any]:
  """JSON-ready summary of a report (for experiment runners)."""
  return {"ok": report.ok, "max_rel": report.max_rel,
          "first_bad_block": report.first_bad_block,
          "leaves": {l.path: l.max_rel for l in report.leaves}}
