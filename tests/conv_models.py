"""Small convolutional test models shared by the test files."""

from __future__ import annotations

from typing import Any, Callable

import jax
import jax.numpy as jnp

import tessel_jax as tj


def conv_stack(channels: tuple[int, ...], hw: int, rows: int,
               cut_after: int = 0, scale: float = 0.2
               ) -> tuple[Callable[..., Any], dict, dict]:
  """``(loss, params, batch)``: 3x3 "SAME" convolutions (NHWC, HWIO), layer
  ``i`` mapping ``channels[i]`` to ``channels[i + 1]`` features on ``hw x
  hw`` maps, ``tanh`` after each, a ``tj.boundary`` after layer
  ``cut_after``, the mean square as the loss; weights drawn at ``scale``,
  ``rows`` rows of input."""
  keys = jax.random.split(jax.random.PRNGKey(0), len(channels))
  params = {"w": [jax.random.normal(k, (3, 3, a, b)) * scale
                  for k, a, b in zip(keys, channels, channels[1:])]}

  def loss(p, batch):
    x = batch["x"]
    for i, w in enumerate(p["w"]):
      x = jnp.tanh(jax.lax.conv_general_dilated(
          x, w, (1, 1), "SAME", dimension_numbers=("NHWC", "HWIO", "NHWC")))
      if i == cut_after:
        x = tj.boundary(x)
    return jnp.mean(x ** 2)

  batch = {"x": jax.random.normal(keys[-1], (rows, hw, hw, channels[0]))}
  return loss, params, batch


def two_convs(hw: int, channels: int, rows: int
              ) -> tuple[Callable[..., Any], dict, dict]:
  """``(loss, params, batch)``: two 3x3 "SAME" convolutions of
  ``channels`` features on ``hw x hw`` maps, a ``tj.boundary`` between them
  (:func:`conv_stack`); ``rows`` rows of input."""
  return conv_stack((channels,) * 3, hw, rows)


def swapped_then_canonical(rows: int = 4, small: int = 128, big: int = 48
                           ) -> tuple[Callable[..., Any], dict, dict]:
  """``(loss, params, batch)``: two 3x3 "SAME" convolutions of ``small``
  features on 2x2 maps (kernel larger than the map: XLA's simplifier swaps
  their operands into a slow generic loop at the top level of a program;
  ``passes.conv_forms`` runs them as one dot), the map reshaped to 8x8 and
  tiled to ``big`` features, two 3x3 convolutions on it (canonical), each
  convolution followed by ``tanh``; no markers. 12 equations: the small
  convolutions are equations 0 and 2, the big ones 6 and 8."""
  keys = jax.random.split(jax.random.PRNGKey(0), 5)
  params = {"small": [jax.random.normal(k, (3, 3, small, small)) * 0.05
                      for k in keys[:2]],
            "big": [jax.random.normal(k, (3, 3, big, big)) * 0.1
                    for k in keys[2:4]]}

  def conv(x, w):
    return jnp.tanh(jax.lax.conv_general_dilated(
        x, w, (1, 1), "SAME", dimension_numbers=("NHWC", "HWIO", "NHWC")))

  def loss(p, batch):
    x = batch["x"]
    for w in p["small"]:
      x = conv(x, w)
    x = x.reshape((x.shape[0], 8, 8, -1))
    x = jnp.tile(x, (1, 1, 1, big // x.shape[-1]))
    for w in p["big"]:
      x = conv(x, w)
    return jnp.mean(x ** 2)

  batch = {"x": jax.random.normal(keys[4], (rows, 2, 2, small))}
  return loss, params, batch
