"""A plain-JAX GPT pipelined over 4 devices, cut at tj.boundary markers.

Run: python examples/gpt_markers.py   (any machine; 4 fake CPU devices)

The embedding is block 0, each transformer layer one block; the M-shape
placement runs the embedding and the tied head on every device and one layer
per device. The pipelined loss and gradients are checked against
jax.value_and_grad of the plain function.
"""

import jax
import jax.numpy as jnp
import numpy as np

import tessel_jax as tj

mesh = tj.cpu_mesh(4)  # call before other JAX work; real runs: jax.make_mesh

VOCAB, D, SEQ, LAYERS, HEADS = 64, 32, 16, 4, 4


def init(key):
  keys = iter(jax.random.split(key, 4 * LAYERS + 2))
  dense = lambda *shape: jax.random.normal(next(keys), shape) * 0.02
  layers = [{"qkv": dense(D, 3 * D), "proj": dense(D, D),
             "fc": dense(D, 4 * D), "out": dense(4 * D, D)}
            for _ in range(LAYERS)]
  return {"wte": dense(VOCAB, D), "wpe": dense(SEQ, D), "layers": layers}


def norm(x):
  return (x - x.mean(-1, keepdims=True)) * jax.lax.rsqrt(
      x.var(-1, keepdims=True) + 1e-5)


def attention(p, x):
  b, s, _ = x.shape
  q, k, v = jnp.split(norm(x) @ p["qkv"], 3, axis=-1)
  split = lambda t: t.reshape(b, s, HEADS, D // HEADS)
  scores = jnp.einsum("bqhd,bkhd->bhqk", split(q), split(k)) / (D // HEADS) ** .5
  scores = jnp.where(jnp.tril(jnp.ones((s, s), bool)), scores, -1e9)
  mixed = jnp.einsum("bhqk,bkhd->bqhd", jax.nn.softmax(scores), split(v))
  return x + mixed.reshape(b, s, D) @ p["proj"]


def layer(p, x):
  x = attention(p, x)
  return x + jax.nn.gelu(norm(x) @ p["fc"]) @ p["out"]


def loss_fn(params, batch):
  x = params["wte"][batch["tokens"]] + params["wpe"][None]
  x = tj.boundary(x)                      # block 0: the embedding
  for i, p in enumerate(params["layers"]):
    x = layer(p, x)
    if i < LAYERS - 1:
      x = tj.boundary(x)                  # blocks 1..4: one layer each
  logp = jax.nn.log_softmax(norm(x) @ params["wte"].T)   # tied head
  return -jnp.take_along_axis(logp, batch["labels"][..., None], -1).mean()


def main():
  params = init(jax.random.key(0))
  tokens = jax.random.randint(jax.random.key(1), (32, SEQ + 1), 0, VOCAB)
  batch = {"tokens": tokens[:, :-1], "labels": tokens[:, 1:]}
  n = 8
  step = tj.schedule(loss_fn, mesh=mesh, placement=tj.placements.mshape(4),
                     num_microbatches=n)
  loss, grads = step(params, batch)
  print(step.grid())

  def mean_loss(params):   # what the pipeline computes: mean over micro-batches
    mbs = jax.tree.map(lambda a: a.reshape(n, -1, *a.shape[1:]), batch)
    return jnp.mean(jax.vmap(lambda mb: loss_fn(params, mb))(mbs))

  ref_loss, ref_grads = jax.jit(jax.value_and_grad(mean_loss))(params)
  err = max(float(np.max(np.abs(a - b)) / (np.max(np.abs(b)) + 1e-12))
            for a, b in zip(jax.tree.leaves(grads), jax.tree.leaves(ref_grads)))
  print(f"loss {float(loss):.6f} (plain JAX {float(ref_loss):.6f}),"
        f" largest relative gradient error {err:.1e}")
  assert abs(float(loss) - float(ref_loss)) <= 1e-5 * abs(float(ref_loss))
  assert err <= 1e-5


if __name__ == "__main__":
  main()
