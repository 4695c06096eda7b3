"""A model as per-layer costs, the input of the time/memory frontier.

:class:`ModelCosts` holds, for one micro-batch on one device, the seconds of
each layer's forward and backward, the bytes it stashes for the backward,
its parameter bytes and the bytes it hands to the next layer
(:class:`LayerCost`); it round-trips through JSON (the frontier runner
records it with its results; ``experiments.gpt_profile`` builds measured
ones). :func:`gpt_costs` derives analytic costs of a GPT-like decoder from a
:class:`GPTConfig` (``PRESETS`` names a few). Split out of ``frontier``,
which re-exports these names. No jax here.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from typing import Any


@dataclasses.dataclass(frozen=True)
class LayerCost:
  """Costs of one layer for one micro-batch on one device.

  Attributes:
    name: Label (``embed``, ``layer3``, ``head``).
    forward_s: Seconds of the forward (> 0).
    backward_s: Seconds of the backward (>= 0; 0 for inference-only costs).
    activation_bytes: Bytes the forward keeps until the backward.
    param_bytes: Bytes of the layer's parameters.
    output_bytes: Bytes of the activation handed to the next layer.
  """

  name: str
  forward_s: float
  backward_s: float
  activation_bytes: int
  param_bytes: int
  output_bytes: int

  def __post_init__(self) -> None:
    if not (self.forward_s > 0 and math.isfinite(self.forward_s)):
      raise ValueError(f"layer {self.name!r}: forward_s must be a finite"
                       f" number of seconds > 0, got {self.forward_s!r}")
    if not (self.backward_s >= 0 and math.isfinite(self.backward_s)):
      raise ValueError(f"layer {self.name!r}: backward_s must be >= 0, got"
                       f" {self.backward_s!r}")
    for key in ("activation_bytes", "param_bytes", "output_bytes"):
      if getattr(self, key) < 0:
        raise ValueError(f"layer {self.name!r}: {key} must be >= 0, got"
                         f" {getattr(self, key)!r}")


@dataclasses.dataclass(frozen=True)
class ModelCosts:
  """A model as a chain of layers with their costs.

  Attributes:
    name: Label of the model (``mt5_like``, ``measured gpt``...).
    layers: The layers in forward order.
    microbatch_rows: Rows (sequences) of the micro-batch the costs are for.
    source: ``"analytic"`` or ``"measured"``.
  """

  name: str
  layers: tuple[LayerCost, ...]
  microbatch_rows: int = 1
  source: str = "analytic"

  def __post_init__(self) -> None:
    object.__setattr__(self, "layers", tuple(self.layers))
    if not self.layers:
      raise ValueError(f"model {self.name!r} has no layers")

  def to_dict(self) -> dict[str, Any]:
    return {"name": self.name, "microbatch_rows": self.microbatch_rows,
            "source": self.source,
            "layers": [dataclasses.asdict(l) for l in self.layers]}

  @classmethod
  def from_dict(cls, data: Mapping[str, Any]) -> "ModelCosts":
    return cls(name=str(data["name"]),
               layers=tuple(LayerCost(**l) for l in data["layers"]),
               microbatch_rows=int(data.get("microbatch_rows", 1)),
               source=str(data.get("source", "analytic")))


@dataclasses.dataclass(frozen=True)
class GPTConfig:
  """An analytic GPT: shapes and the device's speed.

  Attributes:
    vocab: Vocabulary (embedding rows, head columns).
    d_model: Hidden size.
    layers: Transformer layers.
    heads: Attention heads.
    seq: Sequence length.
    microbatch_rows: Sequences per micro-batch.
    activation_bytes: Bytes per activation value (2: bf16).
    param_bytes: Bytes per parameter value (4: fp32 master weights).
    device_flops: Sustained flop/s of one device.
    memory_bandwidth: Bytes/s of one device's memory (embedding lookups).
  """

  vocab: int = 250112
  d_model: int = 1024
  layers: int = 24
  heads: int = 16
  seq: int = 512
  microbatch_rows: int = 8
  activation_bytes: int = 2
  param_bytes: int = 4
  device_flops: float = 100e12
  memory_bandwidth: float = 2e12


#: Analytic presets: ``mt5_like`` (mT5-large sized decoder with mT5's
#: 250k vocabulary: the embedding and the head are each about as big as 20
#: layers), ``gpt_small`` and ``tiny`` (tests).
PRESETS: dict[str, GPTConfig] = {
    "mt5_like": GPTConfig(),
    "gpt_small": GPTConfig(vocab=32000, d_model=512, layers=8, heads=8,
                           seq=256, microbatch_rows=4),
    "tiny": GPTConfig(vocab=512, d_model=64, layers=4, heads=4, seq=32,
                      microbatch_rows=4, device_flops=1e12,
                      memory_bandwidth=1e11),
}


def gpt_costs(config: GPTConfig, name: str = "gpt") -> ModelCosts:
  """Per-layer costs of an analytic GPT (embedding, layers, untied head).

  With ``t = rows x seq`` tokens, ``d`` the hidden size, ``a`` heads, ``V``
  the vocabulary and ``F`` the device's flop/s:

  * transformer layer: forward ``(24 t d^2 + 4 t seq d) / F`` (the four
    projections and the two attention matmuls), backward twice that;
    stash ``t d (34 + 5 a seq / d)`` bytes at 2 bytes per value
    (Korthikanti et al., 2022; scaled by ``activation_bytes / 2``);
    ``12 d^2 + 13 d`` parameters;
  * embedding: a lookup, memory-bound: forward ``t d`` activation bytes
    over the memory bandwidth, backward that plus writing the dense
    ``V d`` gradient; stashes the token ids; ``V d + seq d`` parameters;
  * head (untied, as in mT5 v1.1): forward ``2 t d V / F``, backward twice
    that; stashes its input and the logits (``activation_bytes``) and the
    fp32 softmax; ``V d + 2 d`` parameters.

  Every layer hands ``t d`` activation values to the next.
  """
  c = config
  for key in ("vocab", "d_model", "layers", "heads", "seq", "microbatch_rows",
              "activation_bytes", "param_bytes"):
    if getattr(c, key) < 1:
      raise ValueError(f"GPTConfig.{key} must be >= 1, got {getattr(c, key)}")
  if not (c.device_flops > 0 and c.memory_bandwidth > 0):
    raise ValueError("GPTConfig.device_flops and memory_bandwidth must be > 0")
  t, d, v = c.microbatch_rows * c.seq, c.d_model, c.vocab
  ab = c.activation_bytes
  hidden = t * d * ab
  embed = LayerCost(
      "embed", forward_s=hidden / c.memory_bandwidth,
      backward_s=(hidden + v * d * c.param_bytes) / c.memory_bandwidth,
      activation_bytes=t * 4, param_bytes=(v * d + c.seq * d) * c.param_bytes,
      output_bytes=hidden)
  f_layer = (24 * t * d * d + 4 * t * c.seq * d) / c.device_flops
  stash = int(t * d * (34 + 5 * c.heads * c.seq / d) * ab / 2)
  layers = [LayerCost(f"layer{i}", forward_s=f_layer, backward_s=2 * f_layer,
                      activation_bytes=stash,
                      param_bytes=(12 * d * d + 13 * d) * c.param_bytes,
                      output_bytes=hidden)
            for i in range(c.layers)]
  f_head = 2 * t * d * v / c.device_flops
  head = LayerCost("head", forward_s=f_head, backward_s=2 * f_head,
                   activation_bytes=hidden + t * v * (ab + 4),
                   param_bytes=(v * d + 2 * d) * c.param_bytes,
                   output_bytes=4)
  return ModelCosts(name=name, layers=(embed, *layers, head),
                    microbatch_rows=c.microbatch_rows, source="analytic")
