"""Small convolutional test models shared by the test files."""

from __future__ import annotations

from typing import Any, Callable

import jax
import jax.numpy as jnp

import tessel_jax as tj


def two_convs(hw: int, channels: int, rows: int
              ) -> tuple[Callable[..., Any], dict, dict]:
  """``(loss, params, batch)``: two 3x3 "SAME" convolutions (NHWC, HWIO) of
  ``channels`` features on ``hw x hw`` maps, ``tanh`` after each, a
  ``tj.boundary`` between them, the mean square as the loss; ``rows``
  rows of input."""
  k1, k2, k3 = jax.random.split(jax.random.PRNGKey(0), 3)
  params = {"w": [jax.random.normal(k, (3, 3, channels, channels)) * 0.2
                  for k in (k1, k2)]}

  def loss(p, batch):
    x = batch["x"]
    for i, w in enumerate(p["w"]):
      x = jnp.tanh(jax.lax.conv_general_dilated(
          x, w, (1, 1), "SAME", dimension_numbers=("NHWC", "HWIO", "NHWC")))
      if i == 0:
        x = tj.boundary(x)
    return jnp.mean(x ** 2)

  batch = {"x": jax.random.normal(k3, (rows, hw, hw, channels))}
  return loss, params, batch
