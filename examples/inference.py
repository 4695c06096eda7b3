"""Pipelined batch inference (mode="infer"): next-token logits per row.

Run: python examples/inference.py   (any machine; 4 fake CPU devices)

In inference the function returns any pytree of arrays; the scheduled
function returns them for every micro-batch, concatenated along axis 0
(the batch's order), here checked against the plain function on the whole
batch.
"""

import jax
import jax.numpy as jnp
import numpy as np

import tessel_jax as tj

mesh = tj.cpu_mesh(4)

VOCAB, D, LAYERS = 64, 32, 4


def forward(params, batch):
  h = params["wte"][batch["tokens"]]
  h = tj.boundary(h)                       # block 0: embedding
  for i, w in enumerate(params["layers"]):
    h = h + jnp.tanh(h @ w)
    if i < LAYERS - 1:
      h = tj.boundary(h)                   # blocks 1..4: a layer each
  return h[:, -1] @ params["wte"].T        # tied head: last position's logits


def main():
  keys = jax.random.split(jax.random.key(0), LAYERS + 1)
  params = {"wte": jax.random.normal(keys[0], (VOCAB, D)) * 0.1,
            "layers": [jax.random.normal(k, (D, D)) * 0.1 for k in keys[1:]]}
  batch = {"tokens": jax.random.randint(jax.random.key(1), (64, 8), 0, VOCAB)}
  infer = tj.schedule(forward, mesh=mesh, placement="mshape",
                      num_microbatches=16, mode="infer")
  logits = infer(params, batch)
  print(infer.grid())
  expected = forward(params, batch)   # tj.boundary is the identity outside
  err = float(np.max(np.abs(logits - expected)))
  print(f"logits {logits.shape}, next tokens {jnp.argmax(logits, -1)[:8]},"
        f" largest difference from the plain function {err:.1e}")
  assert logits.shape == (64, VOCAB) and err <= 1e-5


if __name__ == "__main__":
  main()
