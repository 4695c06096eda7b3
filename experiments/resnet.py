"""A ResNet18-sized conv net written with ``jax.lax.conv`` (11.2M parameters).

ResNet18's layout (7x7/2 stem, 3x3/2 max pool, four stages of two basic
blocks with 64, 128, 256 and 512 channels, global average pool, a linear
head), NHWC, without batch statistics: each convolution is followed by a
per-channel scale and bias (BatchNorm's parameters, no running statistics),
so every image is computed independently and a micro-batch's rows can be
split freely. Parameter-heavy and compute-light at small images (32 x 32):
the case where packing the parameters every call shows.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

STAGES = (64, 128, 256, 512)
BLOCKS_PER_STAGE = 2


def _conv_params(key: Any, k: int, cin: int, cout: int) -> dict[str, Any]:
  w = jax.random.normal(key, (k, k, cin, cout)) * np.sqrt(2.0 / (k * k * cin))
  return {"w": w, "scale": jnp.ones((cout,)), "bias": jnp.zeros((cout,))}


def init(key: Any, classes: int = 1000, channels: int = 3) -> dict[str, Any]:
  """Parameters: ``stem``, ``blocks`` (8 basic blocks) and ``head``."""
  keys = iter(jax.random.split(key, 32))
  params: dict[str, Any] = {"stem": _conv_params(next(keys), 7, channels, 64)}
  blocks = []
  cin = 64
  for s, cout in enumerate(STAGES):
    for b in range(BLOCKS_PER_STAGE):
      blk = {"c1": _conv_params(next(keys), 3, cin, cout),
             "c2": _conv_params(next(keys), 3, cout, cout)}
      blk["c2"]["scale"] = jnp.full((cout,), 0.2)
      if s > 0 and b == 0:
        blk["proj"] = _conv_params(next(keys), 1, cin, cout)
      blocks.append(blk)
      cin = cout
  params["blocks"] = blocks
  params["head"] = {"w": jax.random.normal(next(keys), (cin, classes)) *
                         np.sqrt(1.0 / cin),
                    "b": jnp.zeros((classes,))}
  return params


def _conv(p: dict[str, Any], x: Any, stride: int) -> Any:
  y = jax.lax.conv_general_dilated(
      x, p["w"], (stride, stride), "SAME",
      dimension_numbers=("NHWC", "HWIO", "NHWC"))
  return y * p["scale"] + p["bias"]


def _block(p: dict[str, Any], x: Any, stride: int) -> Any:
  h = jax.nn.relu(_conv(p["c1"], x, stride))
  h = _conv(p["c2"], h, 1)
  skip = _conv(p["proj"], x, stride) if "proj" in p else x
  return jax.nn.relu(h + skip)


def make_loss(boundary: Callable[[Any], Any] | None = None,
              cut_after: tuple[int, ...] = ()) -> Callable[..., Any]:
  """``loss(params, batch)``: softmax cross-entropy of the logits.

  Args:
    boundary: ``tj.boundary`` to mark block cuts (None: no markers).
    cut_after: Basic-block indices after which ``boundary`` is called.
  """

  def loss(params: Any, batch: Any) -> Any:
    x = jax.nn.relu(_conv(params["stem"], batch["x"], 2))
    x = jax.lax.reduce_window(x, -jnp.inf, jax.lax.max, (1, 3, 3, 1),
                              (1, 2, 2, 1), "SAME")
    for i, p in enumerate(params["blocks"]):
      stride = 2 if (i % BLOCKS_PER_STAGE == 0 and i > 0) else 1
      x = _block(p, x, stride)
      if boundary is not None and i in cut_after:
        x = boundary(x)
    x = jnp.mean(x, axis=(1, 2))
    logits = x @ params["head"]["w"] + params["head"]["b"]
    logp = jax.nn.log_softmax(logits)
    return -jnp.mean(jnp.take_along_axis(logp, batch["y"][:, None], axis=1))

  return loss


def batch(rows: int, image: int = 32, classes: int = 1000,
          seed: int = 1) -> dict[str, Any]:
  """``rows`` random images ``(rows, image, image, 3)`` and labels."""
  kx, ky = jax.random.split(jax.random.PRNGKey(seed))
  return {"x": jax.random.normal(kx, (rows, image, image, 3)),
          "y": jax.random.randint(ky, (rows,), 0, classes)}


def count(params: Any) -> int:
  """Parameter count."""
  return sum(int(np.prod(x.shape)) for x in jax.tree_util.tree_leaves(params))
