"""A small GPT cut at any layer groups, and its layers measured (jax).

Shared by ``experiments.frontier`` (measured per-layer costs) and
``experiments.inference`` (one model function per placement). The model is
``train_lib``'s GPT (its layer, norm and parameters; the head tied to the
embedding) on random tokens of a chosen vocabulary, so the embedding and
head can be made as heavy as wanted. Its *layers*, in forward order, are
``embed``, ``layer0 .. layer{L-1}`` and ``head``; a *group* is a
``(start, end)`` range of them (``tessel_jax.search.plan_graph.group_layers``
makes them).

``output="loss"`` ends in the mean next-token loss (training);
``output="nll"`` in each sequence's summed negative log-likelihood, one
value per row (inference: scoring a batch).

Nothing here reads flags; jax is imported by whoever imports this module.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

import tessel_jax as tj
from experiments import train_lib
from tessel_jax.search import frontier

OUTPUTS = ("loss", "nll")

# train_lib's layer and norm (its model, reused as is).
_layer = train_lib.transformer_layer
_norm = train_lib.layer_norm


class GPTShape(NamedTuple):
  """Sizes of the GPT.

  Attributes:
    vocab: Vocabulary (embedding rows = head columns).
    d_model: Hidden size.
    layers: Transformer layers.
    heads: Attention heads.
    seq: Sequence length.
    rows: Sequences per micro-batch.
  """

  vocab: int = 4096
  d_model: int = 64
  layers: int = 4
  heads: int = 4
  seq: int = 32
  rows: int = 8


def layer_names(shape: GPTShape) -> list[str]:
  """``embed``, ``layer0`` .. ``layer{L-1}``, ``head``."""
  return ["embed"] + [f"layer{i}" for i in range(shape.layers)] + ["head"]


def init_params(shape: GPTShape, seed: int = 0) -> dict[str, Any]:
  """``train_lib.init_params`` for these sizes."""
  return train_lib.init_params(jax.random.PRNGKey(seed), shape.vocab,
                               shape.d_model, shape.layers, shape.seq)


def make_batch(shape: GPTShape, rows: int, seed: int = 0
               ) -> dict[str, np.ndarray]:
  """Random ``tokens`` and ``labels`` of ``rows`` sequences."""
  rng = np.random.default_rng(seed)
  toks = rng.integers(0, shape.vocab, (rows, shape.seq + 1)).astype(np.int32)
  return {"tokens": toks[:, :-1], "labels": toks[:, 1:]}


def _run_layers(params: Any, shape: GPTShape, names: Sequence[str], x: Any,
                batch: Any, rows: slice, output: str) -> Any:
  """Runs ``names`` on ``x``; the micro-batch's ``rows`` are sliced where
  they are read (so the slice belongs to the block that reads it)."""
  for name in names:
    if name == "embed":
      tokens = batch["tokens"][rows]
      x = params["wte"][tokens] + params["wpe"][None, :tokens.shape[1]]
    elif name == "head":
      labels = batch["labels"][rows]
      logits = _norm(params["lnf"], x) @ params["wte"].T
      logp = jax.nn.log_softmax(logits, axis=-1)
      nll = -jnp.take_along_axis(logp, labels[..., None], axis=-1)[..., 0]
      x = nll.mean() if output == "loss" else nll.sum(axis=-1)
    else:
      x = _layer(params["layers"][int(name[5:])], x, shape.heads)
  return x


_ALL = slice(None)


def _half(batch: Any, which: int) -> slice:
  h = batch["tokens"].shape[0] // 2
  return slice(0, h) if which == 0 else slice(h, None)


def _check(shape: GPTShape, groups: Sequence[tuple[int, int]],
           output: str) -> list[str]:
  if output not in OUTPUTS:
    raise ValueError(f"output is {output!r}; use one of {OUTPUTS}")
  names = layer_names(shape)
  flat = [i for a, b in groups for i in range(a, b)]
  if flat != list(range(len(names))):
    raise ValueError(f"groups {list(groups)} must cover layers 0..{len(names)}"
                     " in order, each group non-empty")
  return names


def chain_fn(shape: GPTShape, groups: Sequence[tuple[int, int]],
             output: str = "loss") -> Callable[[Any, Any], Any]:
  """The GPT with one block per group (a ``tj.boundary`` between groups)."""
  names = _check(shape, groups, output)

  def gpt(params, batch):
    x = None
    for k, (a, b) in enumerate(groups):
      if k:
        x = tj.boundary(x)
      x = _run_layers(params, shape, names[a:b], x, batch, _ALL, output)
    return x

  return gpt


def _combine(a: Any, b: Any, output: str) -> Any:
  return (a + b) / 2 if output == "loss" else jnp.concatenate([a, b])


def towers_fn(shape: GPTShape, groups: Sequence[tuple[int, int]],
              output: str = "loss") -> Callable[[Any, Any], Any]:
  """X-shape: two towers, each the whole model on half of the rows."""
  names = _check(shape, groups, output)

  def tower(params, batch, which):
    x = None
    for k, (a, b) in enumerate(groups):
      if k:
        x = tj.boundary(x)
      x = _run_layers(params, shape, names[a:b], x, batch,
                      _half(batch, which), output)
    return x if which else tj.boundary(x)

  def gpt(params, batch):
    ya = tower(params, batch, 0)
    yb = tower(params, batch, 1)
    return _combine(ya, yb, output)

  return gpt


def branches_fn(shape: GPTShape, groups: Sequence[tuple[int, int]],
                output: str = "loss") -> Callable[[Any, Any], Any]:
  """K-shape: two branches run ``groups[:-1]`` on half of the rows each,
  then the join block runs ``groups[-1]`` on all rows (the two halves
  concatenated; the all-device join then runs replicated, see
  ``passes.modes``)."""
  names = _check(shape, groups, output)

  def branch(params, batch, which):
    x = None
    for a, b in groups[:-1]:
      x = _run_layers(params, shape, names[a:b], x, batch,
                      _half(batch, which), output)
      x = tj.boundary(x)
    return x

  def gpt(params, batch):
    xa = branch(params, batch, 0)
    xb = branch(params, batch, 1)
    a, b = groups[-1]
    return _run_layers(params, shape, names[a:b],
                       jnp.concatenate([xa, xb]), batch, _ALL, output)

  return gpt


def model_fn(placement: str, shape: GPTShape,
             groups: Sequence[tuple[int, int]],
             output: str = "loss") -> Callable[[Any, Any], Any]:
  """The GPT whose blocks fit ``placement`` (as ``plan_graph.slots`` maps
  layer groups to its forward blocks)."""
  if placement == "xshape":
    return towers_fn(shape, groups, output)
  if placement == "kshape":
    return branches_fn(shape, groups, output)
  if placement in frontier.SUPPORTED:
    return chain_fn(shape, groups, output)
  raise ValueError(f"no GPT model for placement {placement!r}; use one of"
                   f" {', '.join(frontier.SUPPORTED)}")


def _nbytes(x: Any) -> int:
  return int(np.prod(x.shape, dtype=np.int64)) * np.dtype(x.dtype).itemsize


def profile_layers(shape: GPTShape, *, mode: str = "train",
                   cache_dir: str | None = None, reprofile: bool = False,
                   rounds: int = 1, seed: int = 0) -> frontier.ModelCosts:
  """Measures every layer with ``tessel_jax``'s cost model.

  Builds the GPT with one block per layer, all on the first device
  (``tj.Placement``), with ``cost="measured"`` and reads the kernels'
  measurements: each layer's forward (and, training, backward) seconds
  (``KernelProfile.seconds``: alone on the device), its stash bytes and the
  bytes of the parameters it reads. Output bytes are the hidden state
  (``rows x seq x d_model`` float32; the head's: its output).

  Args:
    shape: The GPT.
    mode: ``"train"`` (forward and backward) or ``"infer"``.
    cache_dir: Profile cache (None: ``$TESSEL_JAX_CACHE`` or the default).
    reprofile: Measure again even when cached.
    rounds: Measure this many times (every round after the first
      re-measures) and keep each layer's smallest time: other processes on
      the machine only ever slow a measurement down.
    seed: Parameter and batch seed.
  """
  if rounds < 1:
    raise ValueError(f"rounds must be >= 1, got {rounds}")
  names = layer_names(shape)
  groups = [(i, i + 1) for i in range(len(names))]
  fn = chain_fn(shape, groups, "loss" if mode == "train" else "nll")
  params = init_params(shape, seed)
  batch = make_batch(shape, shape.rows, seed)
  mesh = jax.sharding.Mesh(np.array(jax.devices()[:1]), ("pipe",))
  fwd = [math.inf] * len(names)
  bwd = [math.inf] * len(names)
  for r in range(rounds):
    step = tj.schedule(fn, mesh=mesh,
                       placement=tj.Placement([0] * len(names),
                                              name="gpt_layers"),
                       num_microbatches=1, mode=mode, cost="measured",
                       cache_dir=cache_dir, reprofile=reprofile or r > 0,
                       solver_time_limit_s=5.0)
    built = step.build(params, batch)
    kernels = {k.label: k for k in built.profile.kernels.values()}
    for i in range(len(names)):
      fwd[i] = min(fwd[i], kernels[f"F{i}"].seconds)
      b = kernels.get(f"B{i}")
      bwd[i] = min(bwd[i], b.seconds if b is not None else 0.0)
  leaves = jax.tree_util.tree_leaves(params)
  params_of = {k.label: k.params for k in built.kernels.kernels.values()}
  hidden = shape.rows * shape.seq * shape.d_model * 4
  out_head = 4 if mode == "train" else 4 * shape.rows
  layers = []
  for i, name in enumerate(names):
    layers.append(frontier.LayerCost(
        name=name, forward_s=fwd[i], backward_s=bwd[i],
        activation_bytes=(kernels[f"F{i}"].stash_bytes if mode == "train"
                          else 0),
        param_bytes=sum(_nbytes(leaves[l]) for l in params_of[f"F{i}"]),
        output_bytes=out_head if name == "head" else hidden))
  device = jax.devices()[0]
  return frontier.ModelCosts(
      name=(f"gpt v{shape.vocab} d{shape.d_model} L{shape.layers}"
            f" s{shape.seq} r{shape.rows} ({device.platform})"),
      layers=tuple(layers), microbatch_rows=shape.rows, source="measured")


def group_costs(model: frontier.ModelCosts, groups: Sequence[tuple[int, int]]
                ) -> list[float]:
  """Forward + backward seconds of each group (for reports)."""
  return [math.fsum(l.forward_s + l.backward_s for l in model.layers[a:b])
          for a, b in groups]
