"""Device 1's ResNet18 backward with its weight gradients per micro-batch or deferred.

The placed ResNet18 step (``experiments.placed_bench``'s ``resnet18_auto``,
``vshape(2)``, N = 8 micro-batches of 4 16x16 images) gives device 1 the
last stage and the head: basic blocks 6 and 7 (8.9M parameters, 3x3x512x512
convolutions on 1x1 maps) and the loss, its input ``(4, 1, 1, 256)`` a
micro-batch. :func:`programs` writes that device's backward over the
micro-batches (a ``lax.scan``) three ways, one jitted program each:

* ``per_mb``: what the lowering does now (``passes.param_grads``): each
  micro-batch's backward computes its weight gradients (a fresh 35 MB in
  XLA's temp) and adds them into the accumulators carried by the loop;
* ``deferred``: each micro-batch's backward computes its input cotangent
  and the small gradients (scales, biases, head) only; every convolution's
  input and output cotangent (4 x 512 floats each) is kept, and after the
  loop one weight-gradient convolution per weight over the concatenated
  micro-batches gives the summed gradient (a deferred, batched ``W``);
* ``deferred_recompute``: the same, but the weight gradients come from
  the whole backward rerun over the concatenated micro-batches (keeps only
  the block's inputs: forward and input cotangents computed twice).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np


#: The convolutions of blocks 6 and 7: (block, name, stride).
CONVS = ((0, "c1", 2), (0, "c2", 1), (0, "proj", 2), (1, "c1", 1),
         (1, "c2", 1))
VARIANTS = ("per_mb", "deferred", "deferred_recompute")


@dataclasses.dataclass
class Tap:
  """Where :func:`loss` meets its convolutions: each adds the next of
  ``eps`` (zeros: their gradients are the convolutions' output cotangents)
  to its output and appends its input to ``inputs`` and its output to
  ``outputs``; its weight gets no gradient (``stop_gradient``), so the
  weight-gradient convolution is not in the program. ``eps`` None: adds
  nothing (to find the outputs' shapes)."""

  eps: list[Any] | None
  inputs: list[Any] = dataclasses.field(default_factory=list)
  outputs: list[Any] = dataclasses.field(default_factory=list)


def _conv(x: Any, w: Any, stride: int) -> Any:
  return jax.lax.conv_general_dilated(
      x, w, (stride, stride), "SAME",
      dimension_numbers=("NHWC", "HWIO", "NHWC"))


def _tapped_conv(p: dict[str, Any], x: Any, stride: int,
                 tap: Tap | None) -> Any:
  """``experiments.resnet``'s convolution, through ``tap`` where given."""
  if tap is None:
    y = _conv(x, p["w"], stride)
  else:
    tap.inputs.append(x)
    y = _conv(x, jax.lax.stop_gradient(p["w"]), stride)
    tap.outputs.append(y)
    y = y if tap.eps is None else y + tap.eps.pop(0)
  return y * p["scale"] + p["bias"]


def loss(params: Any, x: Any, y: Any, scale: float,
         tap: Tap | None = None) -> Any:
  """Device 1's loss part (blocks 6 and 7 as ``experiments.resnet``'s, pool,
  head): the rows' cross-entropy summed, times ``scale``."""
  for i, p in enumerate(params["blocks"]):
    stride = 2 if i == 0 else 1
    h = jax.nn.relu(_tapped_conv(p["c1"], x, stride, tap))
    h = _tapped_conv(p["c2"], h, 1, tap)
    skip = _tapped_conv(p["proj"], x, stride, tap) if "proj" in p else x
    x = jax.nn.relu(h + skip)
  x = jnp.mean(x, axis=(1, 2))
  logp = jax.nn.log_softmax(x @ params["head"]["w"] + params["head"]["b"])
  return -scale * jnp.sum(jnp.take_along_axis(logp, y[:, None], axis=1))


def inputs(n: int, rows: int, cin: int = 256, cout: int = 512,
           classes: int = 1000) -> tuple[Any, Any, Any]:
  """``(params, xs, ys)``: blocks 6 and 7 of ResNet18 (``cin`` -> ``cout``
  channels, initialised as ``experiments.resnet.init``) and its head, ``n`` micro-batches of ``rows`` inputs
  ``(1, 1, cin)`` and labels. The defaults are ResNet18's."""
  rng = np.random.default_rng(0)

  def conv(k, i, o):
    w = rng.normal(size=(k, k, i, o)) * np.sqrt(2.0 / (k * k * i))
    return {"w": jnp.asarray(w, jnp.float32), "scale": jnp.ones((o,)),
            "bias": jnp.zeros((o,))}
  blocks = [{"c1": conv(3, cin, cout), "c2": conv(3, cout, cout),
             "proj": conv(1, cin, cout)},
            {"c1": conv(3, cout, cout), "c2": conv(3, cout, cout)}]
  head = {"w": jnp.asarray(rng.normal(size=(cout, classes)) / cout ** 0.5,
                           jnp.float32),
          "b": jnp.zeros((classes,))}
  return ({"blocks": blocks, "head": head},
          jnp.asarray(rng.normal(size=(n, rows, 1, 1, cin)), jnp.float32),
          jnp.asarray(rng.integers(0, classes, (n, rows)), jnp.int32))


def _flat(a: Any) -> Any:
  """Micro-batches ``(n, rows, ...)`` concatenated: ``(n * rows, ...)``."""
  return a.reshape((-1,) + a.shape[2:])


def _add(acc: Any, g: Any) -> Any:
  return jax.tree_util.tree_map(jnp.add, acc, g)


def _with_weights(grads: Any, weights: list[Any]) -> Any:
  """``grads`` with the convolutions' weight gradients set to ``weights``
  (in :data:`CONVS` order)."""
  blocks = [{k: dict(v) for k, v in b.items()} for b in grads["blocks"]]
  for (b, c, _), w in zip(CONVS, weights):
    blocks[b][c]["w"] = w
  return {"blocks": blocks, "head": grads["head"]}


def programs(n: int, rows: int) -> dict[str, Callable[..., Any]]:
  """``{variant: jitted (params, xs, ys) -> (grads, input cotangents)}``
  (see the module docstring); the loss is the mean over all rows."""
  scale = 1.0 / (n * rows)

  def per_mb(p, xs, ys):
    def body(acc, xy):
      gp, gx = jax.grad(loss, argnums=(0, 1))(p, *xy, scale)
      return _add(acc, gp), gx
    return jax.lax.scan(body, jax.tree_util.tree_map(jnp.zeros_like, p),
                        (xs, ys))

  def tapped(p, x, y, eps):
    tap = Tap(list(eps))
    return loss(p, x, y, scale, tap), tap.inputs

  def deferred(p, xs, ys):
    eps = [jnp.zeros(o.shape, o.dtype)
           for o in jax.eval_shape(lambda: _conv_outputs(p, xs[0], ys[0]))]

    def body(acc, xy):
      (gp, gx, dys), ins = jax.grad(tapped, argnums=(0, 1, 3),
                                    has_aux=True)(p, *xy, eps)
      return _add(acc, gp), (gx, ins, dys)
    acc, (gxs, ins, dys) = jax.lax.scan(
        body, jax.tree_util.tree_map(jnp.zeros_like, p), (xs, ys))
    ws = []
    for (b, c, stride), x, dy in zip(CONVS, ins, dys):
      _, vjp = jax.vjp(lambda w, x=x, s=stride: _conv(_flat(x), w, s),
                       p["blocks"][b][c]["w"])
      ws.append(vjp(_flat(dy))[0])
    return _with_weights(acc, ws), gxs

  def deferred_recompute(p, xs, ys):
    def body(c, xy):
      return c, jax.grad(loss, argnums=1)(p, *xy, scale)
    _, gxs = jax.lax.scan(body, 0, (xs, ys))
    return jax.grad(loss)(p, _flat(xs), _flat(ys), scale), gxs

  def _conv_outputs(p, x, y):
    tap = Tap(None)
    loss(p, x, y, scale, tap)
    return tap.outputs

  return {"per_mb": jax.jit(per_mb), "deferred": jax.jit(deferred),
          "deferred_recompute": jax.jit(deferred_recompute)}




#: Pieces of the variants' work, timed beside them (not equal to them).
PARTS = ("no_add", "dx_only", "fwd_mb", "fwd_batched", "grad_batched")


def parts(n: int, rows: int) -> dict[str, Callable[..., Any]]:
  """``{part: jitted (params, xs, ys) -> values}``: ``no_add``, ``per_mb``
  with each micro-batch's weight gradients kept apart (the last one
  returned: no accumulation); ``dx_only``, each micro-batch's input
  cotangent only (no weight gradients); ``fwd_mb``, the forward per
  micro-batch; ``fwd_batched`` and ``grad_batched``, the forward and the
  whole gradient over the concatenated micro-batches."""
  scale = 1.0 / (n * rows)

  def no_add(p, xs, ys):
    def body(_, xy):
      return jax.grad(loss, argnums=(0, 1))(p, *xy, scale)
    return jax.lax.scan(body, jax.tree_util.tree_map(jnp.zeros_like, p),
                        (xs, ys))

  def dx_only(p, xs, ys):
    def body(c, xy):
      return c, jax.grad(loss, argnums=1)(p, *xy, scale)
    return jax.lax.scan(body, 0, (xs, ys))[1]

  def fwd_mb(p, xs, ys):
    def body(c, xy):
      return c + loss(p, *xy, scale), None
    return jax.lax.scan(body, 0.0, (xs, ys))[0]

  return {"no_add": jax.jit(no_add), "dx_only": jax.jit(dx_only),
          "fwd_mb": jax.jit(fwd_mb),
          "fwd_batched": jax.jit(lambda p, xs, ys: loss(
              p, _flat(xs), _flat(ys), scale)),
          "grad_batched": jax.jit(lambda p, xs, ys: jax.grad(loss)(
              p, _flat(xs), _flat(ys), scale))}
