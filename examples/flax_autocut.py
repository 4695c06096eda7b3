"""A flax.nnx model pipelined with the automatic cut (no markers).

Run: python examples/flax_autocut.py   (needs flax; 4 fake CPU devices)

nnx.split gives (graphdef, state); the loss merges them back, so tessel_jax
sees a plain function of the state pytree. cut="auto" places the cuts
between the model's operations to balance the 4 V-shape stages.
"""

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

import tessel_jax as tj

mesh = tj.cpu_mesh(4)

VOCAB, D, LAYERS = 64, 32, 8


class MLP(nnx.Module):

  def __init__(self, rngs):
    self.embed = nnx.Embed(VOCAB, D, rngs=rngs)
    self.layers = nnx.List([nnx.Linear(D, D, rngs=rngs)
                            for _ in range(LAYERS)])
    self.head = nnx.Linear(D, VOCAB, rngs=rngs)

  def __call__(self, tokens):
    x = self.embed(tokens)
    for lin in self.layers:
      x = x + jnp.tanh(lin(x))
    return self.head(x)


graphdef, state = nnx.split(MLP(nnx.Rngs(0)))


def loss_fn(state, batch):
  logits = nnx.merge(graphdef, state)(batch["tokens"])
  logp = jax.nn.log_softmax(logits)
  return -jnp.take_along_axis(logp, batch["labels"][..., None], -1).mean()


def main():
  tokens = jax.random.randint(jax.random.key(1), (16, 9), 0, VOCAB)
  batch = {"tokens": tokens[:, :-1], "labels": tokens[:, 1:]}
  n = 8
  step = tj.schedule(loss_fn, mesh=mesh, placement=tj.placements.vshape(4),
                     num_microbatches=n, cut="auto")
  loss, grads = step(state, batch)
  print(step.grid())

  def mean_loss(state):
    mbs = jax.tree.map(lambda a: a.reshape(n, -1, *a.shape[1:]), batch)
    return jnp.mean(jax.vmap(lambda mb: loss_fn(state, mb))(mbs))

  ref_loss, ref_grads = jax.jit(jax.value_and_grad(mean_loss))(state)
  err = max(float(np.max(np.abs(a - b)) / (np.max(np.abs(b)) + 1e-12))
            for a, b in zip(jax.tree.leaves(grads), jax.tree.leaves(ref_grads)))
  print(f"loss {float(loss):.6f} (plain {float(ref_loss):.6f}), largest"
        f" relative gradient error {err:.1e}")
  assert abs(float(loss) - float(ref_loss)) <= 1e-5 * abs(float(ref_loss))
  assert err <= 1e-5


if __name__ == "__main__":
  main()
