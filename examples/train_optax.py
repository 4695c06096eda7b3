"""An optax training loop on a pipelined step, with checkpoints.

Run: python examples/train_optax.py [checkpoint_dir]
(needs optax, and orbax-checkpoint for checkpoints; 4 fake CPU devices)

The scheduled step returns (loss, grads) like jax.value_and_grad, so any
optax optimiser applies. Parameters and optimiser state are saved with
orbax every few steps; a second run with the same directory resumes from
the last checkpoint.
"""

import pathlib
import sys

import jax
import jax.numpy as jnp
import optax
import orbax.checkpoint as ocp

import tessel_jax as tj

mesh = tj.cpu_mesh(4)

VOCAB, D = 64, 32


def loss_fn(params, batch):
  h = params["wte"][batch["tokens"]]
  h = tj.boundary(h)
  for i, w in enumerate(params["layers"]):
    h = h + jnp.tanh(h @ w)
    if i < len(params["layers"]) - 1:
      h = tj.boundary(h)
  logp = jax.nn.log_softmax(h @ params["wte"].T)
  return -jnp.take_along_axis(logp, batch["labels"][..., None], -1).mean()


def init(key):
  keys = jax.random.split(key, 5)
  return {"wte": jax.random.normal(keys[0], (VOCAB, D)) * 0.1,
          "layers": [jax.random.normal(k, (D, D)) * 0.1 for k in keys[1:]]}


def main(directory, steps=6, save_every=3):
  tokens = jax.random.randint(jax.random.key(1), (32, 9), 0, VOCAB)
  batch = {"tokens": tokens[:, :-1], "labels": tokens[:, 1:]}
  step_fn = tj.schedule(loss_fn, mesh=mesh, num_microbatches=8,
                        placement=tj.placements.mshape(4),
                        optimizer_slots=2)   # Adam's two moments per parameter
  optimizer = optax.adam(1e-2)
  params = init(jax.random.key(0))
  opt_state = optimizer.init(params)

  manager = ocp.CheckpointManager(pathlib.Path(directory).absolute())
  start = 0
  if manager.latest_step() is not None:
    start = manager.latest_step()
    restored = manager.restore(start, args=ocp.args.StandardRestore(
        {"params": params, "opt_state": opt_state}))
    params, opt_state = restored["params"], restored["opt_state"]
    print(f"resumed from step {start}")

  @jax.jit
  def update(params, opt_state, grads):
    updates, opt_state = optimizer.update(grads, opt_state, params)
    return optax.apply_updates(params, updates), opt_state

  losses = []
  for i in range(start, steps):
    loss, grads = step_fn(params, batch)
    params, opt_state = update(params, opt_state, grads)
    losses.append(float(loss))
    print(f"step {i}: loss {float(loss):.4f}")
    if (i + 1) % save_every == 0:
      manager.save(i + 1, args=ocp.args.StandardSave(
          {"params": params, "opt_state": opt_state}))
  manager.wait_until_finished()
  manager.close()
  return losses


if __name__ == "__main__":
  out = sys.argv[1] if len(sys.argv) > 1 else "out/train_optax_ckpt"
  losses = main(out)
  if len(losses) > 1:
    assert losses[-1] < losses[0], losses
