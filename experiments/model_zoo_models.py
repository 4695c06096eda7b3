"""Model definitions for the model zoo, from their own packages, tiny sizes.

Each builder imports its package when called (the ``models`` extra:
``pip install -e '.[models]'``) and returns a :class:`ZooModel`: a step
function ``fn(params, batch)`` written as that package's users write it
(the model code itself is the package's, unmodified; nothing is marked with
``tj.boundary``), its parameters (random init) and one whole batch. Every
function returns a scalar mean loss; ``has_aux`` ones return ``(loss, aux)``.

* ``nnx_transformer``: a ``flax.nnx`` GPT (``nnx.MultiHeadAttention``,
  ``nnx.Dropout`` at rate 0.1 with the module's own ``nnx.Rngs`` stream);
* ``nnx_bn_cnn``: a ``flax.nnx`` CNN of ``nnx.Conv`` + ``nnx.BatchNorm`` in
  training mode; aux = the updated running statistics
  (``nnx.state(model, nnx.BatchStat)``);
* ``eqx_mlp``: ``equinox.nn.MLP`` applied per example with ``jax.vmap``;
* ``eqx_transformer``: ``equinox.nn`` attention + MLP layers, per sequence
  under ``jax.vmap``;
* ``penzai_llama``: penzai's llama-like transformer with
  ``use_layer_stack=True`` (the layers are one scanned stack, which the
  automatic cut splits at layer boundaries, ``passes.scan_split``);
* ``penzai_llama8``: the same with 8 scanned layers (2 per block on
  vshape(4));
* ``hf_gpt2``: Hugging Face ``FlaxGPT2LMHeadModel`` built from a
  ``GPT2Config`` (no download), deterministic (``train=False``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

VOCAB = 64
SEQ = 8
WIDTH = 32
LAYERS = 4


class ZooModel(NamedTuple):
  """A step function, its parameters and a batch (all micro-batches)."""

  name: str
  package: str
  fn: Callable[[Any, Any], Any]
  params: Any
  batch: Any
  has_aux: bool = False


def cross_entropy(logits: Any, labels: Any) -> Any:
  """Mean token cross-entropy."""
  logp = jax.nn.log_softmax(logits, axis=-1)
  return -jnp.mean(jnp.take_along_axis(logp, labels[..., None], axis=-1))


def token_batch(rows: int, seed: int = 1) -> dict[str, Any]:
  rng = np.random.default_rng(seed)
  return {"tokens": jnp.asarray(rng.integers(0, VOCAB, (rows, SEQ)), jnp.int32),
          "labels": jnp.asarray(rng.integers(0, VOCAB, (rows, SEQ)), jnp.int32)}


def _fresh(state: Any) -> Any:
  """New Variables around the same arrays: nnx refuses to update Variables
  made outside the trace that updates them (dropout counts, batch stats)."""
  return jax.tree_util.tree_map(jnp.asarray, state)


def nnx_transformer(rows: int) -> ZooModel:
  from flax import nnx  # pylint: disable=import-outside-toplevel

  class Block(nnx.Module):

    def __init__(self, rngs: nnx.Rngs):
      self.ln1 = nnx.LayerNorm(WIDTH, rngs=rngs)
      self.att = nnx.MultiHeadAttention(num_heads=2, in_features=WIDTH,
                                        decode=False, rngs=rngs)
      self.ln2 = nnx.LayerNorm(WIDTH, rngs=rngs)
      self.fc = nnx.Linear(WIDTH, 2 * WIDTH, rngs=rngs)
      self.out = nnx.Linear(2 * WIDTH, WIDTH, rngs=rngs)
      self.drop = nnx.Dropout(0.1, rngs=rngs)

    def __call__(self, x: Any) -> Any:
      mask = nnx.make_causal_mask(jnp.ones(x.shape[:2], jnp.int32))
      x = x + self.drop(self.att(self.ln1(x), mask=mask))
      return x + self.drop(self.out(jax.nn.gelu(self.fc(self.ln2(x)))))

  class GPT(nnx.Module):

    def __init__(self, rngs: nnx.Rngs):
      self.wte = nnx.Embed(VOCAB, WIDTH, rngs=rngs)
      self.wpe = nnx.Embed(SEQ, WIDTH, rngs=rngs)
      self.blocks = nnx.List([Block(rngs) for _ in range(LAYERS)])
      self.lnf = nnx.LayerNorm(WIDTH, rngs=rngs)

    def __call__(self, tokens: Any) -> Any:
      h = self.wte(tokens) + self.wpe(jnp.arange(tokens.shape[1]))
      for block in self.blocks:
        h = block(h)
      return self.wte.attend(self.lnf(h))

  graphdef, params, rest = nnx.split(GPT(nnx.Rngs(params=0, dropout=1)),
                                     nnx.Param, ...)

  def nnx_transformer_loss(params: Any, batch: Any) -> Any:
    model = nnx.merge(graphdef, params, _fresh(rest))
    return cross_entropy(model(batch["tokens"]), batch["labels"])

  return ZooModel("nnx_transformer", "flax", nnx_transformer_loss, params,
                  token_batch(rows))


def nnx_bn_cnn(rows: int) -> ZooModel:
  from flax import nnx  # pylint: disable=import-outside-toplevel

  class CNN(nnx.Module):

    def __init__(self, rngs: nnx.Rngs):
      chans = [3, 8, 8, 8]
      self.convs = nnx.List([nnx.Conv(a, b, (3, 3), rngs=rngs)
                             for a, b in zip(chans, chans[1:])])
      self.norms = nnx.List([nnx.BatchNorm(b, rngs=rngs) for b in chans[1:]])
      self.fc = nnx.Linear(chans[-1], 10, rngs=rngs)

    def __call__(self, x: Any) -> Any:
      for conv, norm in zip(self.convs, self.norms):
        x = jax.nn.relu(norm(conv(x)))
      return self.fc(x.mean(axis=(1, 2)))

  model = CNN(nnx.Rngs(0))
  model.train()
  graphdef, params, rest = nnx.split(model, nnx.Param, ...)

  def nnx_bn_cnn_loss(params: Any, batch: Any) -> Any:
    m = nnx.merge(graphdef, params, _fresh(rest))
    loss = cross_entropy(m(batch["image"]), batch["label"])
    return loss, nnx.state(m, nnx.BatchStat)

  rng = np.random.default_rng(1)
  batch = {"image": jnp.asarray(rng.standard_normal((rows, 8, 8, 3)),
                                jnp.float32),
           "label": jnp.asarray(rng.integers(0, 10, (rows,)), jnp.int32)}
  return ZooModel("nnx_bn_cnn", "flax", nnx_bn_cnn_loss, params, batch,
                  has_aux=True)


def eqx_mlp(rows: int) -> ZooModel:
  import equinox as eqx  # pylint: disable=import-outside-toplevel

  model = eqx.nn.MLP(16, 10, WIDTH, 4, key=jax.random.key(0))
  params, static = eqx.partition(model, eqx.is_array)

  def eqx_mlp_loss(params: Any, batch: Any) -> Any:
    m = eqx.combine(params, static)
    return cross_entropy(jax.vmap(m)(batch["x"]), batch["y"])

  rng = np.random.default_rng(1)
  batch = {"x": jnp.asarray(rng.standard_normal((rows, 16)), jnp.float32),
           "y": jnp.asarray(rng.integers(0, 10, (rows,)), jnp.int32)}
  return ZooModel("eqx_mlp", "equinox", eqx_mlp_loss, params, batch)


def eqx_transformer(rows: int) -> ZooModel:
  import equinox as eqx  # pylint: disable=import-outside-toplevel

  class Layer(eqx.Module):
    ln1: eqx.nn.LayerNorm
    att: eqx.nn.MultiheadAttention
    ln2: eqx.nn.LayerNorm
    mlp: eqx.nn.MLP

    def __init__(self, key: Any):
      k1, k2 = jax.random.split(key)
      self.ln1 = eqx.nn.LayerNorm(WIDTH)
      self.att = eqx.nn.MultiheadAttention(2, WIDTH, key=k1)
      self.ln2 = eqx.nn.LayerNorm(WIDTH)
      self.mlp = eqx.nn.MLP(WIDTH, WIDTH, 2 * WIDTH, 1, activation=jax.nn.gelu,
                            key=k2)

    def __call__(self, x: Any) -> Any:
      h = jax.vmap(self.ln1)(x)
      mask = jnp.tril(jnp.ones((x.shape[0], x.shape[0]), bool))
      x = x + self.att(h, h, h, mask=mask)
      return x + jax.vmap(self.mlp)(jax.vmap(self.ln2)(x))

  class Model(eqx.Module):
    emb: eqx.nn.Embedding
    layers: list
    lnf: eqx.nn.LayerNorm

    def __init__(self, key: Any):
      keys = jax.random.split(key, LAYERS + 1)
      self.emb = eqx.nn.Embedding(VOCAB, WIDTH, key=keys[0])
      self.layers = [Layer(k) for k in keys[1:]]
      self.lnf = eqx.nn.LayerNorm(WIDTH)

    def __call__(self, tokens: Any) -> Any:
      h = jax.vmap(self.emb)(tokens)
      for layer in self.layers:
        h = layer(h)
      return jax.vmap(self.lnf)(h) @ self.emb.weight.T

  params, static = eqx.partition(Model(jax.random.key(0)), eqx.is_array)

  def eqx_transformer_loss(params: Any, batch: Any) -> Any:
    m = eqx.combine(params, static)
    return cross_entropy(jax.vmap(m)(batch["tokens"]), batch["labels"])

  return ZooModel("eqx_transformer", "equinox", eqx_transformer_loss, params,
                  token_batch(rows))


def penzai_llama(rows: int, layers: int = LAYERS,
                 name: str = "penzai_llama") -> ZooModel:
  """penzai's llama-like model, its ``layers`` decoder blocks one scanned
  layer stack."""
  from penzai import pz  # pylint: disable=import-outside-toplevel
  from penzai.models.transformer.variants import llamalike_common  # pylint: disable=import-outside-toplevel

  config = llamalike_common.LlamalikeTransformerConfig(
      num_kv_heads=2, query_head_multiplier=1, embedding_dim=WIDTH,
      projection_dim=WIDTH // 2, mlp_hidden_dim=2 * WIDTH,
      num_decoder_blocks=layers, vocab_size=VOCAB, mlp_variant="swiglu",
      tie_embedder_and_logits=True, use_layer_stack=True)
  model = llamalike_common.build_llamalike_transformer(
      config, init_base_rng=jax.random.key(0))
  unbound, params = pz.unbind_params(model, freeze=True)

  def penzai_llama_loss(params: Any, batch: Any) -> Any:
    m = pz.bind_variables(unbound, params)
    out = m(pz.nx.wrap(batch["tokens"]).tag("batch", "seq"))
    logits = out.untag("batch", "seq", "vocabulary").unwrap()
    return cross_entropy(logits, batch["labels"])

  penzai_llama_loss.__name__ = f"{name}_loss"
  return ZooModel(name, "penzai", penzai_llama_loss, params, token_batch(rows))


def penzai_llama8(rows: int) -> ZooModel:
  return penzai_llama(rows, layers=8, name="penzai_llama8")


def hf_gpt2(rows: int) -> ZooModel:
  from transformers import FlaxGPT2LMHeadModel, GPT2Config  # pylint: disable=import-outside-toplevel

  config = GPT2Config(vocab_size=VOCAB, n_positions=SEQ, n_embd=WIDTH,
                      n_layer=LAYERS, n_head=2)
  # The weights initialised in one compiled program (``_do_init=False``):
  # transformers' own init runs the initialisers op by op, ~2x the CPU
  # (the same key and initialisers; values within float32 rounding).
  model = FlaxGPT2LMHeadModel(config, seed=0, _do_init=False)
  params = jax.jit(model.init_weights, static_argnums=1)(
      jax.random.PRNGKey(0), model.input_shape)

  def hf_gpt2_loss(params: Any, batch: Any) -> Any:
    logits = model(batch["tokens"], params=params, train=False).logits
    return cross_entropy(logits, batch["labels"])

  return ZooModel("hf_gpt2", "transformers", hf_gpt2_loss, params,
                  token_batch(rows))


BUILDERS: dict[str, Callable[[int], ZooModel]] = {
    "nnx_transformer": nnx_transformer,
    "nnx_bn_cnn": nnx_bn_cnn,
    "eqx_mlp": eqx_mlp,
    "eqx_transformer": eqx_transformer,
    "penzai_llama": penzai_llama,
    "penzai_llama8": penzai_llama8,
    "hf_gpt2": hf_gpt2,
}
