"""A hand-written GPipe in plain JAX, the peer ``experiments.peer_bench`` races.

The pattern the JAX ``shard_map`` documentation teaches: the stage
parameters are stacked along a leading axis sharded over the pipe axis, one
``lax.scan`` runs ``N + S - 1`` ticks, each tick every stage applies its
layers to what it holds and passes the result on with one ``ppermute``; the
first stage feeds micro-batch ``t``, the last stage adds the loss of
micro-batch ``t - S + 1``. ``jax.grad`` through the scan gives the backward
pipeline. Bubble ticks compute on whatever the stage holds (their results
are masked out), as in the textbook version.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.sharding import PartitionSpec as P


def mlp_params(layers: int, hidden: int, seed: int = 0) -> list[dict[str, Any]]:
  """``layers`` dense layers ``{"w": (hidden, hidden), "b": (hidden,)}``."""
  keys = jax.random.split(jax.random.PRNGKey(seed), layers)
  return [{"w": jax.random.normal(k, (hidden, hidden)) / np.sqrt(hidden),
           "b": jnp.zeros((hidden,))} for k in keys]


def stack_stages(params: list[dict[str, Any]], stages: int) -> dict[str, Any]:
  """Layers grouped into ``stages`` equal stages: ``w`` is (S, L/S, H, H)."""
  per = len(params) // stages
  if per * stages != len(params):
    raise ValueError(f"{len(params)} layers do not split into {stages} stages")
  return {k: jnp.stack([jnp.stack([p[k] for p in params[s * per:(s + 1) * per]])
                        for s in range(stages)]) for k in ("w", "b")}


def unstack_stages(stacked: dict[str, Any]) -> list[dict[str, Any]]:
  """Inverse of :func:`stack_stages`."""
  s, per = stacked["w"].shape[:2]
  return [{k: stacked[k][i, j] for k in ("w", "b")}
          for i in range(s) for j in range(per)]


def _stage(w: Any, b: Any, h: Any) -> Any:
  for j in range(w.shape[0]):
    h = jnp.tanh(h @ w[j] + b[j])
  return h


def gpipe_loss(mesh: Any, axis: str, num_microbatches: int
               ) -> Callable[[Any, Any], Any]:
  """``loss(stacked, batch)``: mean squared error, GPipe over ``axis``.

  Args:
    mesh: Mesh with the pipe axis ``axis`` (``S`` stages).
    axis: Pipe axis name.
    num_microbatches: ``N``; ``batch["x"]``/``["y"]`` have ``N * rows`` rows.
  """
  n = num_microbatches
  stages = mesh.shape[axis]
  perm = [(i, i + 1) for i in range(stages - 1)]

  def body(stacked: Any, x: Any, y: Any) -> Any:
    w, b = stacked["w"][0], stacked["b"][0]
    s = lax.axis_index(axis)
    xs = x.reshape((n, -1) + x.shape[1:])
    ys = y.reshape((n, -1) + y.shape[1:])

    def tick(carry: Any, t: Any) -> Any:
      held, loss = carry
      h = jnp.where(s == 0, xs[jnp.minimum(t, n - 1)], held)
      h = _stage(w, b, h)
      out = t - (stages - 1)
      part = jnp.mean((h - ys[jnp.clip(out, 0, n - 1)]) ** 2)
      loss = loss + jnp.where((s == stages - 1) & (out >= 0), part, 0.0)
      return (lax.ppermute(h, axis, perm), loss), None

    init = lax.pcast((jnp.zeros_like(xs[0]), jnp.zeros((), x.dtype)), axis,
                     to="varying")
    (_, loss), _ = lax.scan(tick, init,
                            jnp.arange(n + stages - 1))
    return lax.psum(loss, axis) / n

  smap = jax.shard_map(body, mesh=mesh,
                       in_specs=({"w": P(axis), "b": P(axis)}, P(), P()),
                       out_specs=P())
  return lambda stacked, batch: smap(stacked, batch["x"], batch["y"])


def gpipe_step(mesh: Any, axis: str, num_microbatches: int
               ) -> Callable[[Any, Any], Any]:
  """``jax.jit(jax.value_and_grad(gpipe_loss))``; grads stacked like params."""
  return jax.jit(jax.value_and_grad(gpipe_loss(mesh, axis, num_microbatches)))


def plain_loss(num_microbatches: int) -> Callable[[Any, Any], Any]:
  """The same loss without a pipeline: the mean over micro-batches."""
  n = num_microbatches

  def loss(params: list[dict[str, Any]], batch: Any) -> Any:
    def one(mb: Any) -> Any:
      h = mb[0]
      for p in params:
        h = jnp.tanh(h @ p["w"] + p["b"])
      return jnp.mean((h - mb[1]) ** 2)
    xs = batch["x"].reshape((n, -1) + batch["x"].shape[1:])
    ys = batch["y"].reshape((n, -1) + batch["y"].shape[1:])
    return jnp.mean(lax.map(one, (xs, ys)))
  return loss


def data_parallel_step(mesh: Any, axis: str, num_microbatches: int
                       ) -> Callable[[Any, Any], Any]:
  """Data parallel over ``axis``: each device takes ``N / D`` micro-batches
  with the whole model; the loss and gradients are averaged once."""
  d = mesh.shape[axis]
  if num_microbatches % d:
    raise ValueError(f"N = {num_microbatches} does not split over {d}"
                     f" data-parallel devices")
  local = jax.value_and_grad(plain_loss(num_microbatches // d))

  def body(params: Any, x: Any, y: Any) -> Any:
    # Varying copies, so the local gradient is this device's alone.
    params = lax.pcast(params, axis, to="varying")
    loss, grads = local(params, {"x": x, "y": y})
    return lax.pmean(loss, axis), lax.pmean(grads, axis)

  smap = jax.shard_map(body, mesh=mesh, in_specs=(P(), P(axis), P(axis)),
                       out_specs=(P(), P()))
  return jax.jit(lambda params, batch: smap(params, batch["x"], batch["y"]))
