"""Small heterogeneous models for the lowering tests (shared helpers).

Every model has int32 tokens in, a tied embedding (the embedding matrix is
also the output head), activations of different shapes and dtypes crossing
boundaries (a bfloat16 copy, a per-example gate, the int32 labels), and a
scalar loss. ``reference`` computes ``jax.value_and_grad`` of the mean over
micro-batches, the quantity ``tj.schedule`` must reproduce.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

import tessel_jax as tj

VOCAB = 11
HIDDEN = 8
SEQ = 3


def make_params(num_layers: int, seed: int = 0) -> dict[str, Any]:
  keys = jax.random.split(jax.random.PRNGKey(seed), num_layers + 2)
  return {
      "wte": jax.random.normal(keys[0], (VOCAB, HIDDEN)) * 0.5,
      "layers": [{"w": jax.random.normal(k, (HIDDEN, HIDDEN)) * 0.4,
                  "b": jnp.full((HIDDEN,), 0.01 * i)}
                 for i, k in enumerate(keys[1:num_layers + 1])],
      "gate": jax.random.normal(keys[-1], (HIDDEN,)) * 0.3,
  }


def make_batch(rows: int, seed: int = 1) -> dict[str, Any]:
  rng = np.random.default_rng(seed)
  return {"tokens": jnp.asarray(rng.integers(0, VOCAB, (rows, SEQ)), jnp.int32),
          "labels": jnp.asarray(rng.integers(0, VOCAB, (rows, SEQ)), jnp.int32)}


def embed(params: Any, tokens: Any) -> Any:
  return params["wte"][tokens]


def layer(p: Any, h: Any) -> Any:
  return jnp.tanh(h @ p["w"] + p["b"]) + h


def head_loss(params: Any, h: Any, labels: Any) -> Any:
  logits = h @ params["wte"].T
  logp = jax.nn.log_softmax(logits, axis=-1)
  return -jnp.mean(jnp.take_along_axis(logp, labels[..., None], axis=-1))


def chain_fn(kinds: Sequence[str]) -> Callable[[Any, Any], Any]:
  """A chain model: one block per entry of ``kinds``.

  ``embed`` (tokens -> h), ``layer`` (one layer), ``mixed`` (a layer whose
  output crosses the boundary as bfloat16 plus a per-example gate),
  ``head`` (layer + tied head + loss). Layer parameters are used in order.
  """

  def fn(params: Any, batch: Any) -> Any:
    li = 0
    h = None
    extra = None
    for bi, kind in enumerate(kinds):
      if kind == "embed":
        h = embed(params, batch["tokens"])
      else:
        if extra is not None:  # the mixed block's cargo arrives here
          h16, gate = extra
          h = h16.astype(jnp.float32) * (1.0 + gate[:, None, None])
          extra = None
        h = layer(params["layers"][li], h)
        li += 1
        if kind == "mixed":
          gate = jnp.tanh(h.mean(axis=(1, 2)))      # shape (b,)
          extra = (h.astype(jnp.bfloat16), gate)
        if kind == "head":
          return head_loss(params, h, batch["labels"])
      if bi < len(kinds) - 1:
        if extra is not None:
          extra = tj.boundary(extra)
        else:
          h = tj.boundary(h)
    raise AssertionError("the last kind must be 'head'")

  return fn


def num_layers(kinds: Sequence[str]) -> int:
  return sum(1 for k in kinds if k != "embed")


def two_tower_fn(per_tower: int) -> Callable[[Any, Any], Any]:
  """X-shape model: two chains of ``per_tower`` blocks, losses summed."""

  def tower(params, batch, offset, last):
    h = embed(params, batch["tokens"])
    for i in range(per_tower):
      if i:
        h = layer(params["layers"][offset + i - 1], h)
      if i < per_tower - 1:
        h = tj.boundary(h)
    loss = head_loss(params, h, batch["labels"])
    return loss if last else tj.boundary(loss)

  def fn(params, batch):
    la = tower(params, batch, 0, False)
    lb = tower(params, batch, per_tower - 1, True)
    return la + 0.5 * lb

  return fn


def k_fn(half: int) -> Callable[[Any, Any], Any]:
  """K-shape model: branches A and B of ``half`` blocks, joined by a head."""

  def branch(params, batch, offset):
    h = embed(params, batch["tokens"]) * (1.0 + offset)
    for i in range(half):
      if i:
        h = layer(params["layers"][offset + i - 1], h)
      h = tj.boundary(h)
    return h

  def fn(params, batch):
    a = branch(params, batch, 0)
    b = branch(params, batch, half - 1)
    h = layer(params["layers"][2 * half - 2], a + 0.5 * b)
    return head_loss(params, h, batch["labels"])

  return fn


def reference(fn: Callable[[Any, Any], Any], params: Any, batch: Any,
              n: int, jit: bool = False) -> tuple[Any, Any]:
  """``jax.value_and_grad`` of the mean of ``fn`` over ``n`` micro-batches
  (``jit``: one micro-batch's ``value_and_grad`` compiled once and its
  ``n`` results averaged, cheaper than op by op for a model of many small
  ops, e.g. a GPT, and than compiling ``n`` copies of the model)."""
  mbs = jax.tree_util.tree_map(
      lambda x: x.reshape((n, -1) + x.shape[1:]), batch)
  if jit:
    vg = jax.jit(jax.value_and_grad(fn))
    outs = [vg(params, jax.tree_util.tree_map(lambda x: x[m], mbs))
            for m in range(n)]
    return jax.tree_util.tree_map(lambda *xs: sum(xs) / n, *outs)

  def mean_loss(p):
    return jnp.mean(jnp.stack([fn(p, jax.tree_util.tree_map(
        lambda x: x[m], mbs)) for m in range(n)]))
  return jax.value_and_grad(mean_loss)(params)


def reference_infer(fn: Callable[[Any, Any], Any], params: Any, batch: Any,
                    n: int) -> Any:
  mbs = jax.tree_util.tree_map(lambda x: x.reshape((n, -1) + x.shape[1:]),
                               batch)
  outs = [fn(params, jax.tree_util.tree_map(lambda x: x[m], mbs))
          for m in range(n)]
  return jax.tree_util.tree_map(
      lambda *xs: jnp.concatenate(xs) if xs[0].ndim else jnp.stack(xs), *outs)


def max_rel_err(got: Any, want: Any) -> float:
  """Largest ``max|a-b| / max|b|`` over the leaves."""
  errs = []
  for a, b in zip(jax.tree_util.tree_leaves(got),
                  jax.tree_util.tree_leaves(want)):
    a = np.asarray(a, np.float64)
    b = np.asarray(b, np.float64)
    scale = max(np.max(np.abs(b)), 1e-30)
    errs.append(float(np.max(np.abs(a - b)) / scale))
  return max(errs)


def steps_with_switch(fn: Callable[[Any, Any], Any], params: Any, batch: Any,
                      n: int, switch: str, **schedule_kw: Any
                      ) -> dict[bool, Any]:
  """``{on: step}`` for ``on`` True then False: ``fn`` scheduled on
  ``vshape(2)`` over 2 devices (markers cut, uniform costs, ``n``
  micro-batches) with ``Switches(**{switch: on})``, each step's loss and
  gradients checked against :func:`reference` (relative error <= 1e-5)."""
  from tessel_jax import placements  # pylint: disable=import-outside-toplevel
  from tessel_jax.passes import switches  # pylint: disable=import-outside-toplevel
  mesh = jax.make_mesh((2,), ("pipe",), devices=jax.devices()[:2])
  ref_loss, ref_grads = reference(fn, params, batch, n)
  steps = {}
  for on in (True, False):
    step = tj.schedule(fn, mesh=mesh, placement=placements.vshape(2),
                       num_microbatches=n, cut="markers", cost="uniform",
                       switches=switches.Switches(**{switch: on}),
                       **schedule_kw)
    loss, grads = step(params, batch)
    assert max_rel_err(loss, ref_loss) <= 1e-5, (switch, on)
    assert max_rel_err(grads, ref_grads) <= 1e-5, (switch, on)
    steps[on] = step
  return steps


def uniform_chain_build(kinds: Sequence[str], devices: Sequence[int]) -> Any:
  """``step.build`` of ``chain_fn(kinds)`` on a 2-device pipe mesh, block
  ``i`` on device ``devices[i]``, 4 micro-batches of a 16-row batch,
  uniform costs (nothing timed): the cost tests' small built program."""
  mesh = jax.make_mesh((2,), ("pipe",))
  step = tj.schedule(chain_fn(kinds), mesh=mesh,
                     placement=tj.Placement(list(devices)),
                     num_microbatches=4, cost="uniform")
  return step.build(make_params(num_layers(kinds)), make_batch(16))
